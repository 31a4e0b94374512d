//! The PTX built from the `gpu` crate by `build.rs`, embedded in the library.

/// PTX for sm_80 and newer (Ampere, Ada, and through the driver's JIT every later arch).
pub const SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/gpu_sm_80.ptx"));
/// PTX for sm_90 (Hopper), built for the arch-specific target sm_90a (`wgmma`): loadable on compute
/// capability 9.0 only.
pub const SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/gpu_sm_90.ptx"));

/// The PTX to load on a device of compute capability `major.minor`, with the arch it targets; `None`
/// when the device is older than sm_80. The sm_90 PTX targets sm_90a, which the driver JIT-compiles
/// for 9.0 only, so later archs (10.x, 12.x) get the portable sm_80 PTX.
pub fn for_compute_capability(major: i32, minor: i32) -> Option<(&'static str, &'static str)> {
    match (major, minor) {
        (9, 0) => Some(("sm_90", SM90)),
        (m, _) if m >= 8 => Some(("sm_80", SM80)),
        _ => None,
    }
}

/// Names of the kernel entry points in a PTX text (`.visible .entry NAME(`).
pub fn entry_points(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .collect()
}
