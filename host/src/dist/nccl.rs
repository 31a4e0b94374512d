//! The NCCL calls `host::dist` makes, loaded at run time from `libnccl.so.2` (PyTorch's wheels ship it
//! as `nvidia/nccl/lib/libnccl.so.2`; `RGK_NCCL_LIB` names another file). Only the C ABI of
//! `nccl.h` is used, and only entry points present since NCCL 2.18, so any 2.18+ library works.
//!
//! Communicators are created with an explicit `ncclConfig_t` (blocking; see `dist::join` for why and
//! how no call then waits for a peer); a call that returns `ncclInProgress` is still polled through
//! `ncclCommGetAsyncError`, so a non-blocking configuration would work unchanged.
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

pub(crate) type NcclComm = *mut c_void;
pub(crate) type CudaStream = *mut c_void;

pub(crate) const SUCCESS: c_int = 0;
pub(crate) const IN_PROGRESS: c_int = 7;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub internal: [c_char; 128],
}

/// `ncclConfig_t` as NCCL 2.18 laid it out. NCCL reads the first `size` bytes and gives every field a
/// later version added its default, so this prefix is valid for every newer library.
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: "use the default".
const UNDEF_INT: c_int = c_int::MIN;

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` (blocking calls).
    pub(crate) fn blocking() -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 2 * 10000 + 18 * 100,
            blocking: 1,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
        }
    }
}

/// `ncclDataType_t` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum DataType {
    Float16 = 6,
    Float32 = 7,
    Bfloat16 = 9,
}

/// `ncclRedOp_t` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum RedOp {
    Sum = 0,
    Max = 2,
    Avg = 4,
}

type Res = c_int;

/// The entry points, resolved once.
pub(crate) struct Nccl {
    _lib: libloading::Library,
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    pub comm_init_rank_config:
        unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int, *mut Config) -> Res,
    pub comm_finalize: unsafe extern "C" fn(NcclComm) -> Res,
    pub comm_destroy: unsafe extern "C" fn(NcclComm) -> Res,
    pub comm_abort: unsafe extern "C" fn(NcclComm) -> Res,
    pub comm_get_async_error: unsafe extern "C" fn(NcclComm, *mut Res) -> Res,
    pub get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    pub get_last_error: unsafe extern "C" fn(NcclComm) -> *const c_char,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        DataType,
        RedOp,
        NcclComm,
        CudaStream,
    ) -> Res,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        DataType,
        NcclComm,
        CudaStream,
    ) -> Res,
}

// SAFETY: the table holds function pointers into a library that stays loaded for the process's life;
// NCCL's entry points are thread-safe for distinct communicators (each rank thread uses its own).
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

/// Library names tried in order (after `RGK_NCCL_LIB`).
pub(crate) const CANDIDATES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

fn load() -> Result<Nccl, String> {
    let mut tried = Vec::new();
    let mut names: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var("RGK_NCCL_LIB") {
        names.push(p);
    }
    names.extend(CANDIDATES.iter().map(|s| s.to_string()));
    for name in names {
        // SAFETY: loading NCCL runs only its (side-effect free) initialisers.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return resolve(lib, name),
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    Err(format!(
        "the NCCL library could not be loaded; tried {}. Install NCCL 2.18 or newer (PyTorch's wheels \
         ship it in nvidia/nccl/lib), add its folder to LD_LIBRARY_PATH or set RGK_NCCL_LIB to the file",
        tried.join(", ")
    ))
}

fn resolve(lib: libloading::Library, path: String) -> Result<Nccl, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's type is the one nccl.h declares for it.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                format!("{path} has no `{}`: {e} (NCCL 2.18 or newer needed)", $name)
            })?
        };
    }
    Ok(Nccl {
        path: path.clone(),
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank_config: sym!("ncclCommInitRankConfig"),
        comm_finalize: sym!("ncclCommFinalize"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_abort: sym!("ncclCommAbort"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: sym!("ncclGetLastError"),
        all_reduce: sym!("ncclAllReduce"),
        all_gather: sym!("ncclAllGather"),
        _lib: lib,
    })
}

/// The process's NCCL, loaded on first use.
pub(crate) fn nccl() -> Result<&'static Nccl, String> {
    static LIB: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(|e| e.clone())
}

impl Nccl {
    /// `ncclGetErrorString`, and the communicator's last error message where there is one.
    pub(crate) fn describe(&self, code: Res, comm: NcclComm) -> String {
        // SAFETY: NCCL returns static or communicator-owned NUL-terminated strings.
        let name = unsafe { CStr::from_ptr((self.get_error_string)(code)) }
            .to_string_lossy()
            .into_owned();
        let last = if comm.is_null() {
            String::new()
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr((self.get_last_error)(comm)) }
                .to_string_lossy()
                .into_owned()
        };
        if last.is_empty() {
            format!("NCCL error {code} ({name})")
        } else {
            format!("NCCL error {code} ({name}): {last}")
        }
    }

    /// The library's version as (major, minor, patch).
    pub(crate) fn version(&self) -> (u32, u32, u32) {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        unsafe { (self.get_version)(&mut v) };
        let v = v.max(0) as u32;
        // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
        (v / 10000, (v / 100) % 100, v % 100)
    }
}
