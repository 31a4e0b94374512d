//! Hopper warpgroup tensor-core MMA (`wgmma`, sm_90a only): the raw layer under the wgmma
//! FlashAttention variant. Compiled only into the sm_90 PTX (`#[cfg(target_feature = "sm_90a")]` on the
//! module; see `target_cpu` in gpu/ptx_builder.rs).
//!
//! # The hardware model (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate")
//! A *warpgroup* is 4 consecutive warps (128 threads, the first warp's id a multiple of 4).
//! `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}` computes `D (64 x N, f32) = A (64 x 16) B
//! (16 x N) + D`, issued by all 128 threads together and run asynchronously:
//! - A comes from a shared-memory *matrix descriptor* or from registers; B always from a descriptor.
//! - D lives in registers, `N / 2` f32 per thread. Thread `t` of the warpgroup (warp `w = t / 32`,
//!   lane `l`, `g = l / 4`, `q = l % 4`) holds, for each 8-column block `j`, `d[4j]`, `d[4j+1]` = row
//!   `16w + g`, columns `8j + 2q`, `+1`; `d[4j+2]`, `d[4j+3]` = row `16w + g + 8`, same columns: the
//!   `mma.m16n8` accumulator fragments of the warp's 16 rows, block after block.
//! - A in registers (four b32 of two 16-bit elements per thread) uses the `mma.m16n8k16` A fragment
//!   of the warp's 16 rows: `a[0]` = (row g, cols 2q, 2q+1), `a[1]` = (g + 8, same), `a[2]` = (g,
//!   2q+8, 2q+9), `a[3]` = (g + 8, 2q+8, 2q+9). So two 8-column blocks of an accumulator, rounded to
//!   16 bits, are the A operand of the next product (FlashAttention's P V), as with `mma.sync`.
//!
//! Ordering rules this module's callers follow:
//! - [`fence`] (`wgmma.fence`) before the first wgmma of a batch whenever the registers it reads (the
//!   accumulator, or A fragments) were written by ordinary instructions since the last wgmma;
//! - [`commit`] closes the batch into a *wgmma group*; `wait_group N` blocks until at most N groups are
//!   pending. Until then the accumulator registers belong to the tensor core: no instruction may read
//!   or write them. The wait functions here take the accumulators as in-out register operands (they
//!   appear in a PTX comment) so the compiler sees them defined by the wait and never moves a read
//!   above it; ptxas checks the same (it serializes the wgmmas, with a "Potential Performance Loss"
//!   note, when a register is touched in flight; `cargo xtask build-ptx` fails on that note).
//! - shared memory written through the generic proxy (`st.shared`, `cp.async`) must be fenced with
//!   [`fence_proxy_async`] by the writing threads before a barrier after which wgmma reads it.
//!
//! # Shared-memory operands: 128-byte swizzle ([`SwizzledTile`])
//! Both operands here use the 128B-swizzle canonical layout of 16-bit elements: *panels* of 64
//! columns (128 bytes a row), rows at a 128-byte stride, and the 16-byte chunk `c` of row `r` stored
//! at chunk position `c ^ (r % 8)`. The hardware applies that XOR to address bits [4, 7) from bits
//! [7, 10), so a panel base must be 1024-byte aligned (8 rows = one 1024-byte swizzle atom).
//! - K-major (A = Q `[m][k]`, B = K `[n][k]`: k contiguous): the 16 k of one step are 32 bytes of a
//!   row, so step `s` of a panel starts at `panel + 32 (s % 4)`; the 8-row groups (core matrices
//!   along M/N) are 1024 bytes apart: stride byte offset (SBO) 1024; the leading byte offset is
//!   unused for swizzled K-major layouts (set to 1, as the ISA says it is assumed).
//! - MN-major (B = V `[k][n]`: n contiguous, `imm-trans-b = 1`): a k step is 16 rows = 2048 bytes
//!   (`panel + 2048 s`); the 8-row (k) groups are 1024 bytes apart (SBO = 1024), and the leading byte
//!   offset (LBO) is the distance between 64-column panels along N ("swizzled layouts: stride from the
//!   first (swizzle-byte-size/16) rows to the next" in the 128-bit-normalized view, i.e. 8 x 16 bytes
//!   = 64 elements of N).
//!
//! Descriptor bits (64-bit): [0, 14) start address >> 4; [16, 30) LBO >> 4; [32, 46) SBO >> 4;
//! [49, 52) base offset (0: panels are 1024-aligned); [62, 64) swizzle mode (1 = 128B).
use crate::dev::mma::MmaElem;
use crate::dev::shared::check_index;

/// `wgmma.fence.sync.aligned`: orders this warpgroup's register (and prior shared-memory) accesses
/// before the wgmma that follow. All 128 threads call it together.
#[inline(always)]
pub fn fence() {
    // SAFETY: a fence; not `nomem`, so the compiler keeps memory accesses on their side of it.
    unsafe { core::arch::asm!("wgmma.fence.sync.aligned;", options(nostack)) }
}

/// `wgmma.commit_group.sync.aligned`: closes the wgmma issued since the last commit into a group.
#[inline(always)]
pub fn commit() {
    // SAFETY: bookkeeping of this warpgroup's outstanding wgmma.
    unsafe { core::arch::asm!("wgmma.commit_group.sync.aligned;", options(nostack)) }
}

/// `fence.proxy.async.shared::cta`: makes this thread's earlier generic-proxy writes to shared memory
/// (`st.shared`, completed `cp.async`) visible to the async proxy (wgmma operand reads) of threads that
/// synchronize with it afterwards (a barrier).
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a fence.
    unsafe { core::arch::asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// A shared-memory matrix descriptor (see the module doc). `addr` is a shared-window address.
#[inline(always)]
pub fn descriptor(addr: u32, lbo_bytes: u32, sbo_bytes: u32) -> u64 {
    ((addr as u64 >> 4) & 0x3FFF)
        | (((lbo_bytes as u64 >> 4) & 0x3FFF) << 16)
        | (((sbo_bytes as u64 >> 4) & 0x3FFF) << 32)
        | (1u64 << 62)
}

/// Accumulator arrays of the shapes used here (`N / 2` f32 per thread for m64nN): [`Accumulator::wait`]
/// and [`Accumulator::hold`] pass every register through an asm statement as an in-out operand.
pub trait Accumulator {
    /// `wgmma.wait_group.sync.aligned N` with these registers as in-out operands: the compiler sees
    /// them produced by the wait, so no read of them moves above it.
    fn wait<const N: u32>(&mut self);
    /// An empty asm with these registers as in-out operands, right after a [`Accumulator::wait`] of
    /// another accumulator: the same guarantee for a second register set.
    fn hold(&mut self);
}

/// `D (64 x N) = A B + (scale_d != 0 ? D : 0)` for one k16 step, A and B from descriptors (both
/// K-major), and `D += A B` with A from registers and B MN-major (`imm-trans-b = 1`). Issued by the
/// whole warpgroup; the caller brackets it with [`fence`], [`commit`] and a wait.
pub trait Wgmma<Acc>: MmaElem {
    /// # Safety
    /// All 128 threads of the warpgroup call it together (same descriptors); the descriptors describe
    /// shared memory this CTA owns, written and fenced ([`fence_proxy_async`] + barrier) before, and
    /// not written until a wait covering this wgmma; `d` is not touched until that wait.
    #[inline(always)]
    unsafe fn mma_ss(d: &mut Acc, a_desc: u64, b_desc: u64, scale_d: u32) {
        // SAFETY: the caller's.
        unsafe { Self::mma_ss_t::<0, 0>(d, a_desc, b_desc, scale_d) }
    }
    /// # Safety
    /// As for [`Wgmma::mma_ss`]; `a` holds this thread's A fragment.
    unsafe fn mma_rs_tb(d: &mut Acc, a: &[u32; 4], b_desc: u64);
    /// `D (64 x N) = A B + (scale_d != 0 ? D : 0)` with both operands MN-major from descriptors
    /// (`imm-trans-a = 1`, `imm-trans-b = 1`): A stored `[k][m]`, B `[k][n]`, as a product of two
    /// transposed tiles (FlashAttention backward's `dQ = dS K` from the `dS^T` and K tiles).
    ///
    /// # Safety
    /// As for [`Wgmma::mma_ss`].
    #[inline(always)]
    unsafe fn mma_ss_tt(d: &mut Acc, a_desc: u64, b_desc: u64, scale_d: u32) {
        // SAFETY: the caller's.
        unsafe { Self::mma_ss_t::<1, 1>(d, a_desc, b_desc, scale_d) }
    }
    /// `D (64 x N) = A B + (scale_d != 0 ? D : 0)` with both operands from descriptors and their
    /// majorness chosen at compile time (wgmma's `imm-trans-a`, `imm-trans-b`): `TA = 1` for an MN-major A
    /// (stored `[k][m]`), `TB = 1` for an MN-major B (stored `[k][n]`); 0 for K-major (A `[m][k]`,
    /// B `[n][k]`). The GEMM's four storage combinations.
    ///
    /// # Safety
    /// As for [`Wgmma::mma_ss`].
    unsafe fn mma_ss_t<const TA: u32, const TB: u32>(
        d: &mut Acc,
        a_desc: u64,
        b_desc: u64,
        scale_d: u32,
    );
}

macro_rules! accumulator {
    ($n:literal, $first:literal $(, $i:literal)*) => {
        impl Accumulator for [f32; $n] {
            #[inline(always)]
            fn wait<const N: u32>(&mut self) {
                let d = self;
                // SAFETY: waits on this warpgroup's wgmma groups; the operands are only named in a
                // PTX comment. Not `nomem`: shared-memory accesses stay after it.
                unsafe {
                    core::arch::asm!(
                        "wgmma.wait_group.sync.aligned {n};",
                        concat!("// {", $first, "}" $(, " {", $i, "}")*),
                        inout(reg32) d[$first], $(inout(reg32) d[$i],)*
                        n = const N,
                        options(nostack)
                    )
                }
            }
            #[inline(always)]
            fn hold(&mut self) {
                let d = self;
                // SAFETY: an empty asm (a PTX comment).
                unsafe {
                    core::arch::asm!(
                        concat!("// {", $first, "}" $(, " {", $i, "}")*),
                        inout(reg32) d[$first], $(inout(reg32) d[$i],)*
                        options(nostack)
                    )
                }
            }
        }
    };
}

macro_rules! wgmma_impl {
    ($t:ty, $ptx:literal, $n:literal, $nn:literal, $first:literal $(, $i:literal)*) => {
        impl Wgmma<[f32; $n]> for $t {
            #[inline(always)]
            unsafe fn mma_ss_t<const TA: u32, const TB: u32>(d: &mut [f32; $n], a_desc: u64, b_desc: u64, scale_d: u32) {
                unsafe {
                    core::arch::asm!(
                        "{{",
                        ".reg .pred p;",
                        "setp.ne.b32 p, {sd}, 0;",
                        concat!("wgmma.mma_async.sync.aligned.m64n", $nn, "k16.f32.", $ptx, ".", $ptx, " ",
                            "{{{", $first, "}" $(, ", {", $i, "}")*, "}}, {a}, {b}, p, 1, 1, {ta}, {tb};"),
                        "}}",
                        inout(reg32) d[$first], $(inout(reg32) d[$i],)*
                        a = in(reg64) a_desc, b = in(reg64) b_desc, sd = in(reg32) scale_d,
                        ta = const TA, tb = const TB,
                        options(nostack)
                    )
                }
            }
            #[inline(always)]
            unsafe fn mma_rs_tb(d: &mut [f32; $n], a: &[u32; 4], b_desc: u64) {
                unsafe {
                    core::arch::asm!(
                        "{{",
                        ".reg .pred p;",
                        "setp.ne.b32 p, {sd}, 0;",
                        concat!("wgmma.mma_async.sync.aligned.m64n", $nn, "k16.f32.", $ptx, ".", $ptx, " ",
                            "{{{", $first, "}" $(, ", {", $i, "}")*, "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, 1;"),
                        "}}",
                        inout(reg32) d[$first], $(inout(reg32) d[$i],)*
                        a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                        b = in(reg64) b_desc, sd = in(reg32) 1u32,
                        options(nostack)
                    )
                }
            }
        }
    };
}

/// `wgmma ... k8.f32.tf32.tf32` products into an accumulator of `N / 2` f32 a thread (`[f32; 64]`:
/// m64n128k8, `[f32; 128]`: m64n256k8, every shape of [`Accumulator`]), B from a K-major descriptor
/// (tf32 has no transposed form).
/// A tf32 value is an f32 bit pattern whose low 13 bits are zero; the tensor core reads an f32 operand
/// from shared memory as tf32 by ignoring them (an operand stored as plain f32 enters truncated, with
/// no conversion pass). A K-major tile of 32 f32 a row is the same 128-byte swizzle layout as 64
/// 16-bit elements a row, and its k8 step is the same 32-byte step ([`SwizzledTile::desc_k_major`]
/// with `k_step` = the k8 step). The accumulator layout is the one of the module doc.
pub trait Tf32Wgmma: Accumulator {
    /// `D (64 x N, f32) = A B + (scale_d != 0 ? D : 0)` for one k8 step, A from registers: the
    /// thread's fragment of the warp's 16 rows, the `mma.m16n8k8` tf32 layout: `a[0]` = (row g, col
    /// q), `a[1]` = (g + 8, q), `a[2]` = (g, q + 4), `a[3]` = (g + 8, q + 4).
    ///
    /// # Safety
    /// As for [`Wgmma::mma_ss`]; `a` is not written until a wait covering this wgmma.
    unsafe fn mma_tf32_rs(&mut self, a: &[u32; 4], b_desc: u64, scale_d: u32);
    /// As [`Tf32Wgmma::mma_tf32_rs`] with A from a K-major descriptor (the warpgroup's 64 rows,
    /// [`SwizzledTile::desc_k_major`] as for B).
    ///
    /// # Safety
    /// As for [`Wgmma::mma_ss`].
    unsafe fn mma_tf32_ss(&mut self, a_desc: u64, b_desc: u64, scale_d: u32);
}

/// One `wgmma ... m64n$nn k8.f32.tf32.tf32` into the accumulator `$d` (registers `$first`, `$i`...),
/// with A given as its operand text and asm operands: the one asm both [`Tf32Wgmma`] forms share.
macro_rules! tf32_wgmma_asm {
    ($d:ident, $nn:literal, $a_text:literal, [$($a_ops:tt)*], $b:expr, $sd:expr, $first:literal $(, $i:literal)*) => {
        core::arch::asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {sd}, 0;",
            concat!("wgmma.mma_async.sync.aligned.m64n", $nn, "k8.f32.tf32.tf32 ",
                "{{{", $first, "}" $(, ", {", $i, "}")*, "}}, ", $a_text, ", {b}, p, 1, 1;"),
            "}}",
            inout(reg32) $d[$first], $(inout(reg32) $d[$i],)*
            $($a_ops)*
            b = in(reg64) $b, sd = in(reg32) $sd,
            options(nostack)
        )
    };
}

macro_rules! tf32_shape {
    ($n:literal, $nn:literal, $first:literal $(, $i:literal)*) => {
        impl Tf32Wgmma for [f32; $n] {
            #[inline(always)]
            unsafe fn mma_tf32_rs(&mut self, a: &[u32; 4], b_desc: u64, scale_d: u32) {
                let d = self;
                // SAFETY: the caller's.
                unsafe {
                    tf32_wgmma_asm!(d, $nn, "{{{a0}, {a1}, {a2}, {a3}}}",
                        [a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],],
                        b_desc, scale_d, $first $(, $i)*)
                }
            }
            #[inline(always)]
            unsafe fn mma_tf32_ss(&mut self, a_desc: u64, b_desc: u64, scale_d: u32) {
                let d = self;
                // SAFETY: the caller's.
                unsafe {
                    tf32_wgmma_asm!(d, $nn, "{a}", [a = in(reg64) a_desc,], b_desc, scale_d, $first $(, $i)*)
                }
            }
        }
    };
}

/// The accumulator, both 16-bit element types' wgmma methods and the tf32 ones for one shape (`$n`
/// f32 a thread, N = `$nn`): one list of register indices serves all four.
macro_rules! wgmma_shape {
    ($n:literal, $nn:literal, $first:literal $(, $i:literal)*) => {
        accumulator!($n, $first $(, $i)*);
        wgmma_impl!(crate::dev::elem::F16, "f16", $n, $nn, $first $(, $i)*);
        wgmma_impl!(crate::dev::elem::BF16, "bf16", $n, $nn, $first $(, $i)*);
        tf32_shape!($n, $nn, $first $(, $i)*);
    };
}
wgmma_shape!(
    16, "32", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
);
wgmma_shape!(
    32, "64", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
    24, 25, 26, 27, 28, 29, 30, 31
);
wgmma_shape!(
    64, "128", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
    23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
    47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
);
wgmma_shape!(
    48, "96", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
    24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47
);
wgmma_shape!(
    96, "192", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
    23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
    47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70,
    71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
    95
);
wgmma_shape!(
    128, "256", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
    23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
    47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70,
    71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
    95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114,
    115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127
);

/// `setmaxnreg.inc.sync.aligned.u32 N`: raises this warpgroup's register allocation to `N` per
/// thread (a multiple of 8 in 24..=256), waiting until the registers are free: a warp-specialised
/// kernel's consumer warpgroups take the registers its producer gave back. Takes effect only in a
/// kernel whose launch bound caps registers at entry (`launch_bounds!` with 1 block per SM), with
/// each warpgroup's role one branch of one `if`/`else`.
#[inline(always)]
pub fn set_max_registers_inc<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: register reallocation of this warpgroup; every thread of it executes it.
    unsafe {
        core::arch::asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack, nomem))
    }
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lowers this warpgroup's register allocation to `N` per
/// thread, releasing the rest to the SM's pool (a producer warpgroup that only issues copies).
#[inline(always)]
pub fn set_max_registers_dec<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: as for `set_max_registers_inc`.
    unsafe {
        core::arch::asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack, nomem))
    }
}

/// A `ROWS x COLS` tile of 16-bit elements in shared memory in the 128-byte-swizzle layout
/// ([`crate::layout::sw128`]): the layout wgmma descriptors describe. Its base is 1024-byte aligned
/// (checked in checked builds; the kernels carve tiles of whole 1024-byte atoms from the 1024-aligned
/// dynamic window), so every chunk address is 16-byte aligned by construction.
#[derive(Clone, Copy)]
pub struct SwizzledTile<const ROWS: usize, const COLS: usize> {
    base: u32,
}

impl<const ROWS: usize, const COLS: usize> SwizzledTile<ROWS, COLS> {
    const VALID: () = assert!(ROWS % 8 == 0 && ROWS > 0 && COLS % 64 == 0 && COLS > 0);
    /// Bytes of one tile: a multiple of 1024 (8-row swizzle atoms).
    pub const BYTES: usize = ROWS * COLS * 2;
    /// Bytes of one 64-column panel.
    pub const PANEL_BYTES: usize = crate::layout::sw128::panel_bytes(ROWS);
    /// 16-byte chunks per row.
    pub const CHUNKS_PER_ROW: usize = COLS / 8;

    /// The tile at shared-window address `base`, which must be a multiple of 1024 (checked in checked
    /// builds) with `BYTES` bytes this kernel reserved behind it.
    #[inline(always)]
    pub fn at(base: u32) -> Self {
        let () = Self::VALID;
        check_index((base % 1024) as usize, 1);
        Self { base }
    }

    /// Stage `i` of consecutive tiles starting at this one.
    #[inline(always)]
    pub fn stage(self, i: u32) -> Self {
        Self::at(self.base + i * Self::BYTES as u32)
    }

    /// Address of logical chunk `chunk` (elements `8 chunk..8 chunk + 8`) of row `row`.
    #[inline(always)]
    pub fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        check_index(row as usize, ROWS);
        check_index(chunk as usize, Self::CHUNKS_PER_ROW);
        self.base + crate::layout::sw128::chunk_offset(ROWS as u32, row, chunk)
    }

    /// Address of element (row, col) (2-byte aligned; 4-byte aligned for even `col`).
    #[inline(always)]
    pub fn elem_addr(&self, row: u32, col: u32) -> u32 {
        self.chunk_addr(row, col / 8) + (col % 8) * 2
    }

    /// Starts a 16-byte `cp.async` of `src` into chunk (row, chunk), zero-filling it when `fill` is
    /// false.
    ///
    /// # Safety
    /// As [`crate::dev::copy::cp_async_16`]: when `fill`, `src` is 16-byte aligned and readable; no
    /// thread touches the chunk until the copy is waited for and a barrier (plus
    /// [`fence_proxy_async`] before wgmma reads) orders it.
    #[inline(always)]
    pub unsafe fn copy_chunk_async(&self, row: u32, chunk: u32, src: *const u8, fill: bool) {
        // SAFETY: the chunk address is 16-byte aligned and inside the tile; `src` is the caller's.
        unsafe { crate::dev::copy::cp_async_16(self.chunk_addr(row, chunk), src, fill) }
    }

    /// Descriptor of the K-major operand block of rows `row0..row0 + 8 m` (`row0` a multiple of 8;
    /// A: 64 rows, B: N rows) at k step `k_step` (elements `16 k_step..16 k_step + 16` of each row):
    /// `imm-trans = 0`. LBO is unused for swizzled K-major layouts (16 bytes); SBO = 1024 (8 rows).
    #[inline(always)]
    pub fn desc_k_major(&self, row0: u32, k_step: u32) -> u64 {
        check_index((row0 % 8) as usize, 1);
        check_index((16 * k_step) as usize, COLS);
        let addr =
            self.base + (k_step / 4) * Self::PANEL_BYTES as u32 + row0 * 128 + (k_step % 4) * 32;
        descriptor(addr, 16, 1024)
    }

    /// Descriptor of the MN-major B operand (`imm-trans-b = 1`) at k step `k_step`: rows (k)
    /// `16 k_step..16 k_step + 16`, all `COLS` columns (n). SBO = 1024 (8 k rows), LBO = the panel
    /// size (the next 64 columns of n).
    #[inline(always)]
    pub fn desc_mn_major(&self, k_step: u32) -> u64 {
        check_index((16 * k_step) as usize, ROWS);
        descriptor(self.base + k_step * 2048, Self::PANEL_BYTES as u32, 1024)
    }

    /// [`Self::desc_mn_major`] from column `col0` on (a multiple of 64: a panel boundary), for an
    /// operand narrower than the tile: an MN-major A (`imm-trans-a = 1`, M = 64 columns) or a B of
    /// N <= `COLS - col0` columns.
    #[inline(always)]
    pub fn desc_mn_major_from(&self, k_step: u32, col0: u32) -> u64 {
        check_index((16 * k_step) as usize, ROWS);
        check_index((col0 % 64) as usize, 1);
        check_index(col0 as usize, COLS);
        let panel = self.base + (col0 / 64) * Self::PANEL_BYTES as u32;
        descriptor(panel + k_step * 2048, Self::PANEL_BYTES as u32, 1024)
    }
}
