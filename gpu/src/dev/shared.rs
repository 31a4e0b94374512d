//! Shared memory: on-chip, per block, 32 banks of 4 bytes; visible to all threads of the block after a
//! barrier.
//!
//! Rust has no address-space attribute, so shared arrays are declared at module scope in PTX
//! (`global_asm!`) and reached through their 32-bit shared-window address with explicit `ld.shared` /
//! `st.shared`. The [`static_shared!`] macro emits the declaration and a typed accessor together, so the
//! size in the declaration and the length in the type come from one expression, and every array is
//! 16-byte aligned by construction.
use core::marker::PhantomData;

/// Scalar types that can live in shared memory (one `ld.shared.b32` / `st.shared.b32` each).
pub trait SharedScalar: Copy {
    /// # Safety
    /// `addr` must be a 4-byte aligned address inside a shared allocation of this block.
    unsafe fn ld_shared(addr: u32) -> Self;
    /// # Safety
    /// As for `ld_shared`.
    unsafe fn st_shared(addr: u32, v: Self);
}

macro_rules! shared_b32 {
    ($t:ty) => {
        impl SharedScalar for $t {
            #[inline(always)]
            unsafe fn ld_shared(addr: u32) -> Self {
                let v: $t;
                unsafe { core::arch::asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly)) }
                v
            }
            #[inline(always)]
            unsafe fn st_shared(addr: u32, v: Self) {
                unsafe { core::arch::asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack)) }
            }
        }
    };
}
shared_b32!(f32);
shared_b32!(u32);

/// A typed shared-memory array of `N` elements of `T`, known by its shared-window address.
#[derive(Clone, Copy)]
pub struct SharedArray<T, const N: usize> {
    base: u32,
    _elem: PhantomData<T>,
}

impl<T: SharedScalar, const N: usize> SharedArray<T, N> {
    /// Length and alignment facts the type guarantees.
    pub const BYTES: usize = N * core::mem::size_of::<T>();

    /// # Safety
    /// `base` must be the 16-byte aligned address of at least `Self::BYTES` bytes of shared memory that
    /// nothing else uses while this view is live.
    #[inline(always)]
    pub const unsafe fn from_base(base: u32) -> Self {
        Self {
            base,
            _elem: PhantomData,
        }
    }

    /// Shared-window address of element `i` (for `ldmatrix`, `cp.async` and friends).
    #[inline(always)]
    pub fn addr(&self, i: usize) -> u32 {
        self.base + (i * core::mem::size_of::<T>()) as u32
    }

    #[inline(always)]
    pub fn load(&self, i: usize) -> T {
        check_index(i, N);
        // SAFETY: `i < N` (checked in `checked` builds; callers index within N), and the base covers N.
        unsafe { T::ld_shared(self.addr(i)) }
    }

    #[inline(always)]
    pub fn store(&self, i: usize, v: T) {
        check_index(i, N);
        // SAFETY: as for `load`.
        unsafe { T::st_shared(self.addr(i), v) }
    }
}

impl<const N: usize> SharedArray<f32, N> {
    /// Four consecutive f32 from element `i` with one `ld.shared.v4.f32`; `i` must be a multiple of 4
    /// (the base is 16-byte aligned, so the access is too).
    #[inline(always)]
    pub fn load4(&self, i: usize) -> [f32; 4] {
        check_index(i + 3, N);
        if cfg!(feature = "checked") && i % 4 != 0 {
            panic!();
        }
        let (a, b, c, d): (f32, f32, f32, f32);
        // SAFETY: `i + 3 < N` and `i % 4 == 0` (callers index aligned groups of 4 inside the array; checked
        // builds verify both); the base is 16-byte aligned by `static_shared!`.
        unsafe {
            core::arch::asm!(
                "ld.shared.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                p = in(reg32) self.addr(i), options(nostack, readonly)
            )
        }
        [a, b, c, d]
    }

    /// Stores four consecutive floats at element `i` (`st.shared.v4.f32`); `i` must be a multiple of 4.
    #[inline(always)]
    pub fn store4(&self, i: usize, v: [f32; 4]) {
        check_index(i + 3, N);
        let [a, b, c, d] = v;
        // SAFETY: as for `load4`.
        unsafe {
            core::arch::asm!(
                "st.shared.v4.f32 [{p}], {{{a}, {b}, {c}, {d}}};",
                p = in(reg32) self.addr(i), a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, d = in(reg32) d,
                options(nostack)
            )
        }
    }
}

/// Bounds check kept only in `checked` builds (a failure traps: the device-side assert).
#[inline(always)]
pub fn check_index(i: usize, n: usize) {
    if cfg!(feature = "checked") && i >= n {
        panic!();
    }
}

/// Declares a static shared array and a function returning its typed view:
/// `static_shared!(fn scratch() -> [f32; 32] as SCRATCH_SYM);`
#[macro_export]
macro_rules! static_shared {
    ($vis:vis fn $fname:ident() -> [$t:ty; $n:expr] as $sym:ident) => {
        core::arch::global_asm!(
            concat!(".shared .align 16 .b8 ", stringify!($sym), "[{bytes}];"),
            bytes = const ($n * core::mem::size_of::<$t>()),
        );
        #[inline(always)]
        $vis fn $fname() -> $crate::dev::shared::SharedArray<$t, { $n }> {
            let base: u32;
            // SAFETY: takes the address of the array declared just above; touches no memory.
            unsafe {
                core::arch::asm!(concat!("mov.u32 {0}, ", stringify!($sym), ";"), out(reg32) base, options(nostack, nomem, pure));
                $crate::dev::shared::SharedArray::from_base(base)
            }
        }
    };
}

// 1024-byte alignment (not just 16): swizzled tiles apply their XOR to absolute addresses, which needs
// tile bases aligned to the row size (see `layout::TileLayout::block_addr`); 1024 also covers the
// 128/1024-byte swizzle atoms of TMA for later sm_90 paths.
core::arch::global_asm!(".extern .shared .align 1024 .b8 DYN_SMEM[];");

/// Address of the dynamic shared memory of this launch (its size is the launch's `shared_mem_bytes`);
/// a multiple of 1024.
#[inline(always)]
pub fn dynamic_base() -> u32 {
    let base: u32;
    // SAFETY: takes an address; touches no memory.
    unsafe {
        core::arch::asm!("mov.u32 {0}, DYN_SMEM;", out(reg32) base, options(nostack, nomem, pure))
    }
    base
}

/// `ld.shared.v2.f32`: two consecutive floats from shared memory.
///
/// # Safety
/// `addr` is an 8-byte aligned address of 8 readable bytes in this block's shared memory whose writers
/// are ordered before this read (a barrier, or `bar.warp.sync` for writers in this warp).
#[inline(always)]
pub unsafe fn ld_shared_v2_f32(addr: u32) -> [f32; 2] {
    let (a, b): (f32, f32);
    unsafe {
        core::arch::asm!(
            "ld.shared.v2.f32 {{{a}, {b}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b,
            p = in(reg32) addr, options(nostack, readonly)
        )
    }
    [a, b]
}

/// `st.shared.v2.f32`: two consecutive floats to shared memory.
///
/// # Safety
/// `addr` is an 8-byte aligned address of 8 bytes in this block's shared memory that no other thread
/// accesses until a barrier (or an mbarrier phase) after this store.
#[inline(always)]
pub unsafe fn st_shared_v2_f32(addr: u32, v: [f32; 2]) {
    unsafe {
        core::arch::asm!(
            "st.shared.v2.f32 [{p}], {{{a}, {b}}};",
            p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1],
            options(nostack)
        )
    }
}

/// `ld.shared.v4.b32`: 16 bytes from shared memory.
///
/// # Safety
/// `addr` is a 16-byte aligned address of 16 readable bytes in this block's shared memory whose
/// writers are ordered before this read (a barrier, or `bar.warp.sync` for writers in this warp).
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        core::arch::asm!(
            "ld.shared.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg32) addr, options(nostack, readonly)
        )
    }
    [a, b, c, d]
}

/// `st.shared.v4.b32`: 16 bytes to shared memory.
///
/// # Safety
/// `addr` is a 16-byte aligned address of 16 bytes in this block's shared memory that no other thread
/// accesses until a barrier after this store.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    let [a, b, c, d] = v;
    unsafe {
        core::arch::asm!(
            "st.shared.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, d = in(reg32) d,
            options(nostack)
        )
    }
}
