//! Support shared by the models' unit tests: the all-reference executor and a printed, replayable
//! seed (`crate::testing::seed`, which the integration tests use too).
use crate::replace::{Device, Exec, Plan};
pub(crate) use crate::testing::seed;

/// Every op on its CPU reference (no GPU).
pub(crate) fn reference() -> Exec<'static> {
    static NONE: Device = Device::None;
    Exec::new(Plan::all_reference(), &NONE)
}
