use super::{group_by_id, reference as r};
use crate::{DType, Error, HostTensor};

fn table() -> HostTensor {
    HostTensor::new((0..12).map(|v| v as f32).collect(), &[4, 3], DType::F32).unwrap()
}

#[test]
fn gather_picks_rows_including_repeats() {
    let out = r::embedding(&table(), &[2, 0, 2, 3]).unwrap();
    assert_eq!(out.shape, vec![4, 3]);
    assert_eq!(
        out.data,
        vec![6., 7., 8., 0., 1., 2., 6., 7., 8., 9., 10., 11.]
    );
    assert_eq!(r::embedding(&table(), &[]).unwrap().shape, vec![0, 3]);
}

#[test]
fn scatter_adds_repeated_ids_and_zeroes_unused_rows() {
    let dy = HostTensor::new(vec![1., 2., 10., 20., 100., 200.], &[3, 2], DType::F32).unwrap();
    let dw = r::embedding_backward(&[1, 3, 1], &dy, 4).unwrap();
    assert_eq!(dw.data, vec![0., 0., 101., 202., 0., 0., 10., 20.]);
}

#[test]
fn out_of_range_ids_are_errors_naming_the_first() {
    let e = r::embedding(&table(), &[0, 4, 9]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IdOutOfRange {
                count: 2,
                vocab: 4,
                position: 1,
                id: 4,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ids[1] = 4"), "{e}");
    let dy = HostTensor::new(vec![0.0; 2], &[1, 2], DType::F32).unwrap();
    assert!(matches!(
        r::embedding_backward(&[7], &dy, 4),
        Err(Error::IdOutOfRange { .. })
    ));
}

#[test]
fn grouping_is_a_stable_counting_sort() {
    let (order, offsets) = group_by_id(&[2, 0, 2, 3, 0, 2], 5);
    assert_eq!(offsets, vec![0, 2, 2, 5, 6, 6]);
    assert_eq!(order, vec![1, 4, 0, 2, 5, 3]);
    let (order, offsets) = group_by_id(&[], 3);
    assert!(order.is_empty());
    assert_eq!(offsets, vec![0; 4]);
}
