//! The kernel modules embedded in the library: one per op family and arch, each as PTX and, when ptxas
//! was found at build time, as machine code (cubin) too. `build.rs` builds them; [`crate::Gpu`] loads a
//! family's module the first time one of its kernels is launched.
//!
//! Why per family and why machine code: the driver JIT-compiles a PTX module whole when it is loaded. One
//! module holding every kernel took 95.6 s to load on an H100 with an empty JIT cache (2026-11-26), so
//! every fresh machine, container or CI runner waited that long before its first op. A cubin loads
//! without compiling, and a family's module holds only that family's kernels.

/// An op family: the unit of loading. Every kernel belongs to exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Elementwise, broadcasting and dtype-conversion kernels.
    Elementwise,
    /// Reductions and softmax.
    ReduceSoftmax,
    /// Layer norm and embedding.
    NormEmbedding,
    /// Matrix products (f32 on CUDA cores, f16/bf16 on tensor cores).
    Matmul,
    /// FlashAttention and the naive attention reference.
    Attention,
    /// Clifford-algebra layers.
    Clifford,
    /// Linear-layer relevance propagation.
    Lrp,
}

impl Family {
    /// Every family, in the order of the embedded table (gpu/ptx_builder.rs `FAMILIES`).
    pub const ALL: [Family; 7] = [
        Family::Elementwise,
        Family::ReduceSoftmax,
        Family::NormEmbedding,
        Family::Matmul,
        Family::Attention,
        Family::Clifford,
        Family::Lrp,
    ];

    /// The family's name: its cargo feature in the `gpu` crate.
    pub fn name(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise",
            Family::ReduceSoftmax => "reduce_softmax",
            Family::NormEmbedding => "norm_embedding",
            Family::Matmul => "matmul",
            Family::Attention => "attention",
            Family::Clifford => "clifford",
            Family::Lrp => "lrp",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The family whose module holds kernel `entry`, if any.
    pub fn of(entry: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| images(*f).entries.binary_search(&entry).is_ok())
    }
}

/// One arch's build of a family.
#[derive(Clone, Copy, Debug)]
pub struct ArchImage {
    /// The PTX text (the driver JIT-compiles it on load).
    pub ptx: &'static str,
    /// Machine code for the arch (`ptxas -arch=sm_80`, or `sm_90a`), when ptxas was found at build time.
    pub cubin: Option<&'static [u8]>,
    /// ptxas's `-v` report of the cubin build: registers, shared memory, stack and spills per kernel.
    pub ptxas_report: Option<&'static str>,
    /// Why ptxas failed on this module at build time (it then ships as PTX only).
    pub ptxas_error: Option<&'static str>,
    /// The kernel entry points of this build's module, sorted.
    pub entries: &'static [&'static str],
}

/// A family's embedded modules.
#[derive(Clone, Copy, Debug)]
pub struct FamilyImages {
    /// PTX `.target sm_80` and its sm_80 cubin: Ampere, Ada and (PTX through the JIT) later archs.
    pub sm80: ArchImage,
    /// PTX `.target sm_90a` and its sm_90a cubin: compute capability 9.0 only (H100, H200).
    pub sm90: ArchImage,
    /// The kernel entry points of the family (either arch), sorted.
    pub entries: &'static [&'static str],
}

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// The embedded modules of `family`.
pub fn images(family: Family) -> &'static FamilyImages {
    &IMAGES[family.index()]
}

/// Which build a device of compute capability `major.minor` runs: `("sm_90", ...)` on 9.0,
/// `("sm_80", ...)` on 8.0 and newer otherwise; `None` when the device is older than 8.0.
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    match (major, minor) {
        (9, 0) => Some("sm_90"),
        (m, _) if m >= 8 => Some("sm_80"),
        _ => None,
    }
}

/// What a device of compute capability `major.x` running build `arch` (see [`arch_for`]; "sm_80"
/// also runs anywhere as the portable build) loads for `family`: the cubin when there is one that
/// runs there (sm_80 code on 8.x devices; sm_90a code on 9.0), else the PTX. `prefer_ptx` forces the
/// PTX (see [`crate::Gpu`]'s `RGK_MODULE_FORMAT`).
pub fn image_for(family: Family, arch: &'static str, major: i32, prefer_ptx: bool) -> ModuleImage {
    let img = if arch == "sm_90" {
        images(family).sm90
    } else {
        images(family).sm80
    };
    // sm_80 machine code runs on 8.x only; other majors JIT the sm_80 PTX.
    let cubin_runs = arch == "sm_90" || major == 8;
    match img.cubin {
        Some(bytes) if cubin_runs && !prefer_ptx => ModuleImage::Cubin { arch, bytes },
        _ => ModuleImage::Ptx {
            arch,
            text: img.ptx,
        },
    }
}

/// The form a module is loaded in.
#[derive(Clone, Copy, Debug)]
pub enum ModuleImage {
    Cubin {
        arch: &'static str,
        bytes: &'static [u8],
    },
    Ptx {
        arch: &'static str,
        text: &'static str,
    },
}

impl ModuleImage {
    /// "cubin sm_90a", "PTX sm_80", ...: what `Gpu`'s Debug and `cargo xtask doctor` print.
    pub fn describe(&self) -> String {
        match self {
            ModuleImage::Cubin { arch, .. } => format!("cubin {}", cubin_arch(arch)),
            ModuleImage::Ptx { arch, .. } => format!("PTX {} (JIT)", cubin_arch(arch)),
        }
    }
    pub fn bytes(&self) -> usize {
        match self {
            ModuleImage::Cubin { bytes, .. } => bytes.len(),
            ModuleImage::Ptx { text, .. } => text.len(),
        }
    }
}

/// The `-arch` an arch's code is built for (gpu/ptx_builder.rs `target_cpu`).
fn cubin_arch(arch: &str) -> &str {
    TARGETS.iter().find(|t| t.0 == arch).map_or(arch, |t| t.1)
}

/// The launch bounds (`.maxntid` threads, `.minnctapersm` blocks) that `arch`'s PTX (`"sm_80"` or
/// `"sm_90"`) gives kernel `entry`: the most threads a block of it may be launched with. `None` for
/// an unknown kernel or one without bounds.
pub fn launch_bounds(entry: &str, arch: &str) -> Option<(u32, u32)> {
    let img = images(Family::of(entry)?);
    let ptx = if arch == "sm_90" {
        img.sm90.ptx
    } else {
        img.sm80.ptx
    };
    let head = format!(".visible .entry {entry}(");
    let start = ptx.find(&head)?;
    let body = &ptx[start..];
    let (mut threads, mut blocks) = (None, 1);
    for line in body.lines().take_while(|l| !l.starts_with('{')) {
        if let Some(t) = line.strip_prefix(".maxntid ") {
            threads = t.split(',').next().and_then(|v| v.trim().parse().ok());
        } else if let Some(m) = line.strip_prefix(".minnctapersm ") {
            blocks = m.trim().parse().unwrap_or(1);
        }
    }
    threads.map(|t| (t, blocks))
}

/// Embedded bytes (PTX, cubin) and entry points over all families: the size the library carries.
pub fn embedded_totals() -> (usize, usize, usize) {
    let (mut ptx, mut cubin, mut entries) = (0, 0, 0);
    for img in &IMAGES {
        for a in [img.sm80, img.sm90] {
            ptx += a.ptx.len();
            cubin += a.cubin.map_or(0, <[u8]>::len);
        }
        entries += img.entries.len();
    }
    (ptx, cubin, entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_both_arches_and_its_entries_are_in_its_ptx() {
        for f in Family::ALL {
            let img = images(f);
            assert!(img.sm80.ptx.contains(".target sm_80"), "{}", f.name());
            assert!(img.sm90.ptx.contains(".target sm_90a"), "{}", f.name());
            assert!(!img.entries.is_empty(), "{} has no kernels", f.name());
            for arch in [img.sm80, img.sm90] {
                assert!(
                    arch.entries.iter().all(|e| img.entries.contains(e)),
                    "{}",
                    f.name()
                );
            }
            for e in img.entries {
                assert_eq!(Family::of(e), Some(f), "{e} is in more than one family");
            }
            assert!(img.entries.is_sorted());
        }
    }

    #[test]
    fn devices_get_their_arch_and_machine_code_only_where_it_runs() {
        assert_eq!(arch_for(9, 0), Some("sm_90"));
        assert_eq!(arch_for(8, 6), Some("sm_80"));
        assert_eq!(arch_for(12, 0), Some("sm_80"));
        assert_eq!(arch_for(7, 5), None);
        let has_cubin = images(Family::Elementwise).sm80.cubin.is_some();
        let on_12 = image_for(Family::Elementwise, "sm_80", 12, false);
        assert!(matches!(on_12, ModuleImage::Ptx { arch: "sm_80", .. }));
        let on_89 = image_for(Family::Elementwise, "sm_80", 8, false);
        assert_eq!(
            matches!(on_89, ModuleImage::Cubin { arch: "sm_80", .. }),
            has_cubin
        );
        // The portable build on a 9.0 device: sm_80 machine code does not run there.
        let portable = image_for(Family::Elementwise, "sm_80", 9, false);
        assert!(matches!(portable, ModuleImage::Ptx { arch: "sm_80", .. }));
        let forced = image_for(Family::Attention, "sm_90", 9, true);
        assert!(matches!(forced, ModuleImage::Ptx { arch: "sm_90", .. }));
    }
}
