//! Global-memory access: scalar element loads/stores and 16-byte vector accesses.
//!
//! The vector forms take a [`Chunk16`] pointer, a 16-byte aligned type, so a misaligned vector access is
//! a type error at the call site instead of a 716 "misaligned address" at run time; host launchers only
//! choose the vector kernels for buffers whose base address is 16-byte aligned.
use crate::dev::elem::Elem;
use crate::dev::shared::check_index;

/// Four 32-bit words, 16-byte aligned: one `ld.global.v4.b32`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Chunk16(pub [u32; 4]);

/// Read-only (non-coherent cache) 16-byte load.
///
/// # Safety
/// `p.add(i)` must be inside a live allocation that no thread writes during the kernel.
#[inline(always)]
pub unsafe fn load_chunk_ro(p: *const Chunk16, i: u64) -> Chunk16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        core::arch::asm!(
            "ld.global.nc.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg64) p.add(i as usize), options(nostack, readonly, pure)
        )
    }
    Chunk16([a, b, c, d])
}

/// `prefetch.global.L2`: a hint that the line holding chunk `p.add(i)` is read soon, so a later load
/// finds it in L2. Nothing is returned and no register waits on it: it deepens a load pipeline without
/// holding registers.
///
/// # Safety
/// `p.add(i)` must be inside a live allocation (a hint, but an address outside every allocation is
/// still an address the memory checker reports).
#[inline(always)]
pub unsafe fn prefetch_l2(p: *const Chunk16, i: u64) {
    unsafe {
        core::arch::asm!(
            "prefetch.global.L2 [{p}];",
            p = in(reg64) p.add(i as usize), options(nostack, readonly)
        )
    }
}

/// 16-byte store.
///
/// # Safety
/// `p.add(i)` must be inside a live allocation this thread may write.
#[inline(always)]
pub unsafe fn store_chunk(p: *mut Chunk16, i: u64, v: Chunk16) {
    let [a, b, c, d] = v.0;
    unsafe {
        core::arch::asm!(
            "st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg64) p.add(i as usize), a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, d = in(reg32) d,
            options(nostack)
        )
    }
}

/// 16-byte load through the coherent path (`ld.global.v4.b32`), for buffers the kernel also writes.
///
/// # Safety
/// `p.add(i)` must be inside a live allocation; no other thread writes it during the kernel.
#[inline(always)]
pub unsafe fn load_chunk(p: *const Chunk16, i: u64) -> Chunk16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        core::arch::asm!(
            "ld.global.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg64) p.add(i as usize), options(nostack, readonly)
        )
    }
    Chunk16([a, b, c, d])
}

/// Read-only (non-coherent cache) load of one 16-bit element (its bits).
///
/// # Safety
/// `p.add(i)` must be inside a live allocation that no thread writes during the kernel.
#[inline(always)]
pub unsafe fn load_u16_ro(p: *const u16, i: u64) -> u16 {
    let v: u16;
    unsafe {
        core::arch::asm!(
            "ld.global.nc.b16 {v}, [{p}];",
            v = out(reg16) v, p = in(reg64) p.add(i as usize), options(nostack, readonly, pure)
        )
    }
    v
}

/// Stores one 16-bit element (its bits).
///
/// # Safety
/// `p.add(i)` must be inside a live allocation this thread may write.
#[inline(always)]
pub unsafe fn store_u16(p: *mut u16, i: u64, v: u16) {
    unsafe {
        core::arch::asm!(
            "st.global.b16 [{p}], {v};",
            p = in(reg64) p.add(i as usize), v = in(reg16) v, options(nostack)
        )
    }
}

/// Read-only (non-coherent cache) f32 load, `ld.global.nc.f32`.
///
/// # Safety
/// `p.add(i)` must be inside a live allocation that no thread writes during the kernel.
#[inline(always)]
pub unsafe fn load_f32_ro(p: *const f32, i: u64) -> f32 {
    let v: f32;
    unsafe {
        core::arch::asm!(
            "ld.global.nc.f32 {v}, [{p}];",
            v = out(reg32) v, p = in(reg64) p.add(i as usize), options(nostack, readonly, pure)
        )
    }
    v
}

/// A device buffer of `len` elements of `T`, as kernels receive it: pointer and length together, so a
/// `checked` build can bounds-check every access (no raw pointer + length pairs at call sites).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Slice<T> {
    pub ptr: *const T,
    pub len: u64,
}

/// A writable device buffer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SliceMut<T> {
    pub ptr: *mut T,
    pub len: u64,
}

impl<T: Elem> Slice<T> {
    /// Element `i` as f32. In-range by the launcher's validation; checked in `checked` builds.
    #[inline(always)]
    pub fn get(&self, i: u64) -> f32 {
        check_index(i as usize, self.len as usize);
        // SAFETY: `i < len` by the launcher's validation (checked builds verify it).
        unsafe { (*self.ptr.add(i as usize)).to_f32() }
    }
    #[inline(always)]
    pub fn chunks(&self) -> *const Chunk16 {
        self.ptr as *const Chunk16
    }
}

impl Slice<f32> {
    /// Element `i` through the read-only cache. In range by the launcher's validation; checked in
    /// `checked` builds. The buffer must not be written during the kernel.
    #[inline(always)]
    pub fn get_ro(&self, i: u64) -> f32 {
        check_index(i as usize, self.len as usize);
        // SAFETY: `i < len` (launcher validation, checked builds verify); inputs are never outputs.
        unsafe { load_f32_ro(self.ptr, i) }
    }

    /// Elements `i .. i + 4` through the read-only cache with one `ld.global.nc.v4.b32`. The caller
    /// guarantees `i + 4 <= len`, a 16-byte aligned `ptr` and `i % 4 == 0` (checked builds verify all
    /// three). The buffer must not be written during the kernel.
    #[inline(always)]
    pub fn get4_ro(&self, i: u64) -> [f32; 4] {
        check_vec4(i, self.len, self.ptr as u64);
        // SAFETY: in range and 16-byte aligned (above); inputs are never outputs.
        let c = unsafe { load_chunk_ro(self.ptr.add(i as usize) as *const Chunk16, 0) };
        c.0.map(f32::from_bits)
    }
}

/// The conditions of the 4-element f32 accesses: `i + 4 <= len`, `i % 4 == 0` and a 16-byte
/// aligned base (verified in `checked` builds only, like every index).
#[inline(always)]
fn check_vec4(i: u64, len: u64, ptr: u64) {
    check_index(i as usize + 3, len as usize);
    if cfg!(feature = "checked") && (i % 4 != 0 || ptr % 16 != 0) {
        panic!();
    }
}

impl SliceMut<f32> {
    /// Reads back elements `i .. i + 4` with one `ld.global.v4.b32` (for read-modify-write
    /// epilogues). Same conditions as [`SliceMut::set4`]; only the thread that writes them may read
    /// them during the kernel.
    #[inline(always)]
    pub fn get4(&self, i: u64) -> [f32; 4] {
        check_vec4(i, self.len, self.ptr as u64);
        // SAFETY: in range and 16-byte aligned (above); this thread is the elements' one writer.
        let c = unsafe { load_chunk(self.ptr.add(i as usize) as *const Chunk16, 0) };
        c.0.map(f32::from_bits)
    }

    /// Stores elements `i .. i + 4` with one `st.global.v4.b32`. Same conditions as
    /// [`Slice::get4_ro`] (in range, 16-byte aligned), and each element has one writer.
    #[inline(always)]
    pub fn set4(&self, i: u64, v: [f32; 4]) {
        check_vec4(i, self.len, self.ptr as u64);
        // SAFETY: in range and 16-byte aligned (above).
        unsafe {
            store_chunk(
                self.ptr.add(i as usize) as *mut Chunk16,
                0,
                Chunk16(v.map(f32::to_bits)),
            )
        }
    }
}

impl<T: Elem> SliceMut<T> {
    /// The same buffer, read-only (for kernels that read back what they wrote, after a barrier).
    #[inline(always)]
    pub fn as_slice(&self) -> Slice<T> {
        Slice {
            ptr: self.ptr as *const T,
            len: self.len,
        }
    }
    #[inline(always)]
    pub fn set(&self, i: u64, v: f32) {
        check_index(i as usize, self.len as usize);
        // SAFETY: as for `Slice::get`; each output element is written by exactly one thread.
        unsafe { *self.ptr.add(i as usize) = T::from_f32(v) }
    }
    /// Reads back an output element (for `C += ...` epilogues). Same validity rule as `set`; only the
    /// thread that writes element `i` may read it during the kernel.
    #[inline(always)]
    pub fn get(&self, i: u64) -> f32 {
        check_index(i as usize, self.len as usize);
        // SAFETY: as for `Slice::get`.
        unsafe { (*self.ptr.add(i as usize)).to_f32() }
    }
    #[inline(always)]
    pub fn chunks(&self) -> *mut Chunk16 {
        self.ptr as *mut Chunk16
    }
}

const _: () =
    assert!(core::mem::size_of::<Slice<f32>>() == core::mem::size_of::<crate::params::RawSlice>());
const _: () = assert!(
    core::mem::size_of::<SliceMut<f32>>() == core::mem::size_of::<crate::params::RawSlice>()
);
