use super::*;
use crate::HostTensor;

#[test]
fn reference_sums_closed_forms() {
    // sum 1..=n = n(n+1)/2, exactly representable here.
    let n = 1000usize;
    let x = HostTensor::new((1..=n).map(|v| v as f32).collect(), &[n], DType::F32).unwrap();
    assert_eq!(
        reference::reduce(&x, Reduction::Sum, Axis::All)
            .unwrap()
            .data,
        vec![500_500.0]
    );
    assert_eq!(
        reference::reduce(&x, Reduction::Mean, Axis::All)
            .unwrap()
            .data,
        vec![500.5]
    );
    assert_eq!(
        reference::reduce(&x, Reduction::Max, Axis::All)
            .unwrap()
            .data,
        vec![1000.0]
    );
    let m = HostTensor::new(vec![1., 5., 2., -1., -7., -3.], &[2, 3], DType::F32).unwrap();
    assert_eq!(
        reference::reduce(&m, Reduction::Max, Axis::Last)
            .unwrap()
            .data,
        vec![5., -1.]
    );
    assert_eq!(
        reference::reduce(&m, Reduction::Sum, Axis::Last)
            .unwrap()
            .shape,
        vec![2]
    );
}

#[test]
fn reference_max_propagates_nan() {
    let x = HostTensor::new(vec![1., f32::NAN, 3.], &[3], DType::F32).unwrap();
    assert!(
        reference::reduce(&x, Reduction::Max, Axis::All)
            .unwrap()
            .data[0]
            .is_nan()
    );
}

#[test]
fn reference_mean_backward_spreads_evenly() {
    let g = HostTensor::new(vec![4.0, 8.0], &[2], DType::F32).unwrap();
    let dx = reference::backward(&g, Reduction::Mean, Axis::Last, &[2, 4]).unwrap();
    assert_eq!(dx.data, vec![1., 1., 1., 1., 2., 2., 2., 2.]);
}

#[test]
fn partial_block_count_depends_on_size_only() {
    assert_eq!(partial_blocks(1), 1);
    assert_eq!(partial_blocks(MIN_ELEMS_PER_BLOCK + 1), 2);
    assert_eq!(partial_blocks(u64::MAX / 2), MAX_PARTIALS);
}
