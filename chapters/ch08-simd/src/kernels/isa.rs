//! The instruction sets the kernels are built for ([`Isa`]), what each needs of the CPU, and
//! asking the CPU whether it has it. [`KERNELS_ENV`] names a set by [`Isa::name`].

use std::fmt;

/// The environment variable that overrides detection: `scalar`, `avx2`, `avx512`,
/// `avx512vnni`, `neon` or `neondotprod`.
pub const KERNELS_ENV: &str = "LLM_RS_KERNELS";

/// An instruction set the kernels can be built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F, BW and VL (and AVX2, FMA, F16C).
    Avx512,
    /// [`Isa::Avx512`] plus AVX-512 VNNI.
    Avx512Vnni,
    /// AArch64 Advanced SIMD.
    Neon,
    /// NEON with the dot-product extension (`sdot`).
    NeonDotprod,
}

impl Isa {
    /// Every instruction set, in the order of [`KERNELS_ENV`]'s names.
    pub const ALL: [Isa; 6] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Neon,
        Isa::NeonDotprod,
    ];

    /// The name [`KERNELS_ENV`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neondotprod",
        }
    }

    /// The instruction set called `name` (as [`Isa::name`] spells it, any case).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The CPU features the set needs, as the detection macros name them.
    pub fn features(self) -> &'static [&'static str] {
        match self {
            Isa::Scalar => &[],
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Avx512 => &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"],
            Isa::Avx512Vnni => &[
                "avx2",
                "fma",
                "f16c",
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512vnni",
            ],
            Isa::Neon => &["neon"],
            Isa::NeonDotprod => &["neon", "dotprod"],
        }
    }

    /// The features of [`Isa::features`] this CPU lacks (all of them on another architecture).
    pub fn missing_features(self) -> Vec<&'static str> {
        self.features()
            .iter()
            .copied()
            .filter(|f| !cpu_has(f))
            .collect()
    }

    /// Whether this CPU can run the set's kernels.
    pub fn is_available(self) -> bool {
        self.missing_features().is_empty() && (self == Isa::Scalar || self.arch_matches())
    }

    fn arch_matches(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni => cfg!(target_arch = "x86_64"),
            Isa::Neon | Isa::NeonDotprod => cfg!(target_arch = "aarch64"),
        }
    }

    /// The set whose kernels this one uses for the types it has none of its own for.
    pub(super) fn fallback(self) -> Option<Isa> {
        match self {
            Isa::Scalar => None,
            Isa::Avx2 | Isa::Neon => Some(Isa::Scalar),
            Isa::Avx512 => Some(Isa::Avx2),
            Isa::Avx512Vnni => Some(Isa::Avx512),
            Isa::NeonDotprod => Some(Isa::Neon),
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Whether the CPU has `feature` (a name of `is_x86_feature_detected!` or
/// `is_aarch64_feature_detected!`); the macros cache what they find.
fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "f16c" => is_x86_feature_detected!("f16c"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match feature {
            "neon" => std::arch::is_aarch64_feature_detected!("neon"),
            "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}
