//! The kernels of each weight type, chosen once at run time for the CPU at hand.
//!
//! Chapter 6's scalar kernels are the reference and the fallback; this chapter's SIMD kernels
//! ([`crate::simd`]) replace them where the CPU supports them, and are tested against them.
//!
//! A [`KernelSet`] names one instruction set ([`Isa`]). [`KernelSet::get`] gives, for a weight
//! type, the activation quantizer and the dot product that set uses, or that of the set below
//! it where it has none of its own (AVX-512 VNNI → AVX-512 → AVX2 → scalar, NEON with `sdot` →
//! NEON → scalar); [`KernelSet::describe`] says which. The SIMD kernels are unsafe to call on
//! a CPU without their instructions, so a set other than scalar exists only after the CPU was
//! asked: [`KernelSet::detect`] picks the best one (or the one `LLM_RS_KERNELS` names),
//! [`KernelSet::for_isa`] gives a chosen one or `None`.
//!
//! Some instruction sets have more than one kernel for a type (AVX-512 VNNI on 32- or 64-byte
//! registers); [`dot_kernels`] lists every kernel this CPU can run, for tests and benchmarks,
//! and the table in this module records which one each set uses.

use ch01::GgmlType;
use ch06::quants::{
    Block, CastError, FromFloat, VecDot, as_bytes, blocks, blocks_mut, type_traits,
};
use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

/// The environment variable that overrides detection: `scalar`, `avx2`, `avx512`,
/// `avx512vnni`, `neon` or `neondotprod`.
pub const KERNELS_ENV: &str = "LLM_RS_KERNELS";

/// The weight types with kernels, in the order [`KernelSet::describe`] lists them: chapter 6's
/// list, since every type with a scalar kernel has a kernel in every set (its own, or one from
/// the set below it).
use ch06::quants::WEIGHT_TYPES;

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
    fn fallback(self) -> Option<Isa> {
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

/// The kernels used for one weight type.
#[derive(Clone, Copy)]
pub struct TypeKernels {
    pub ty: GgmlType,
    /// The activation format (`vec_dot_type`).
    pub act_ty: GgmlType,
    /// Quantize one activation row of `n` floats into `act_ty`.
    pub quantize_act: FromFloat,
    /// One weight row · one activation row, `n` elements.
    pub vec_dot: VecDot,
    /// Which instruction set these come from (for `describe`): that of `vec_dot`.
    pub isa: Isa,
    /// Which of that set's kernels `vec_dot` is ([`DotKernel::name`]).
    pub variant: &'static str,
    /// Which instruction set `quantize_act` comes from.
    pub act_isa: Isa,
}

impl fmt::Debug for TypeKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypeKernels")
            .field("ty", &self.ty)
            .field("act_ty", &self.act_ty)
            .field("isa", &self.isa)
            .field("variant", &self.variant)
            .field("act_isa", &self.act_isa)
            .finish_non_exhaustive()
    }
}

/// A kernel set: for every weight type, the best kernels of one instruction set (falling back
/// to the set below where it has no version).
///
/// Only this module makes one (the struct cannot be built elsewhere), and only for an
/// instruction set the CPU has: that is what makes handing out its unsafe kernels safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelSet {
    pub isa: Isa,
}

impl KernelSet {
    /// The scalar reference kernels of chapter 6.
    pub const SCALAR: KernelSet = KernelSet { isa: Isa::Scalar };

    /// Preference order for detection: the first available wins.
    const PREFERENCE: [Isa; 6] = [
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::Avx2,
        Isa::NeonDotprod,
        Isa::Neon,
        Isa::Scalar,
    ];

    // ANCHOR: detect
    /// The kernel set to use, decided once: the one [`KERNELS_ENV`] names if the CPU has it,
    /// else the best this CPU supports. A name it cannot honour is reported on stderr.
    pub fn detect() -> KernelSet {
        static CHOSEN: OnceLock<KernelSet> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let value = std::env::var(KERNELS_ENV).ok();
            let (set, warning) = KernelSet::from_env_value(value.as_deref());
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            set
        })
    }

    /// The best kernel set this CPU supports.
    pub fn best() -> KernelSet {
        KernelSet::PREFERENCE
            .into_iter()
            .find_map(KernelSet::for_isa)
            .unwrap_or(KernelSet::SCALAR)
    }

    /// What [`KernelSet::detect`] picks when [`KERNELS_ENV`] is `value`, and the warning to
    /// print when `value` names no set or one this CPU cannot run.
    pub fn from_env_value(value: Option<&str>) -> (KernelSet, Option<String>) {
        let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
            return (KernelSet::best(), None);
        };
        let best = KernelSet::best();
        match Isa::from_name(value) {
            None => {
                let names: Vec<_> = Isa::ALL.iter().map(|i| i.name()).collect();
                let w = format!(
                    "{KERNELS_ENV}={value:?} is not one of {}; using {}",
                    names.join(", "),
                    best.isa
                );
                (best, Some(w))
            }
            Some(isa) => match KernelSet::for_isa(isa) {
                Some(set) => (set, None),
                None => {
                    let w = format!(
                        "{KERNELS_ENV}={value}, but this CPU lacks {}; using {}",
                        isa.missing_features().join(", "),
                        best.isa
                    );
                    (best, Some(w))
                }
            },
        }
    }
    // ANCHOR_END: detect

    /// The kernel set of `isa`, if this CPU can run it.
    pub fn for_isa(isa: Isa) -> Option<KernelSet> {
        isa.is_available().then_some(KernelSet { isa })
    }

    /// Every kernel set this CPU can run, scalar first.
    pub fn available() -> Vec<KernelSet> {
        Isa::ALL
            .into_iter()
            .filter_map(KernelSet::for_isa)
            .collect()
    }

    // ANCHOR: get
    /// The kernels for weight type `ty`, or `None` if even the scalar set has none.
    pub fn get(&self, ty: GgmlType) -> Option<TypeKernels> {
        let t = type_traits(ty)?;
        let act = type_traits(t.vec_dot_type)?;
        let mut kernels = TypeKernels {
            ty,
            act_ty: t.vec_dot_type,
            quantize_act: act.from_float,
            vec_dot: t.vec_dot?,
            isa: Isa::Scalar,
            variant: "scalar",
            act_isa: Isa::Scalar,
        };
        // Down the fallback chain, the first set with a kernel of its own supplies it.
        let (mut dot_found, mut quant_found) = (false, false);
        let mut isa = Some(self.isa).filter(|i| i.is_available());
        while let Some(i) = isa {
            let own = table::DOTS
                .iter()
                .find(|k| k.used_by == Some(i) && k.ty == ty);
            if !dot_found && let Some(k) = own {
                (kernels.vec_dot, kernels.isa, kernels.variant) = (k.vec_dot, k.isa, k.name);
                dot_found = true;
            }
            let own = table::QUANTIZERS
                .iter()
                .find(|k| k.isa == i && k.ty == t.vec_dot_type);
            if !quant_found && let Some(k) = own {
                (kernels.quantize_act, kernels.act_isa) = (k.quantize, k.isa);
                quant_found = true;
            }
            isa = i.fallback();
        }
        Some(kernels)
    }
    // ANCHOR_END: get

    /// One line per type saying which instruction set its kernels use.
    pub fn describe(&self) -> String {
        let mut s = format!("kernels: {}", self.isa);
        for ty in WEIGHT_TYPES {
            if let Some(k) = self.get(ty) {
                s += &format!(
                    "\n  {:<5} vec_dot {:<14} activations {:<4} {}",
                    ty.name(),
                    k.variant,
                    k.act_ty.name(),
                    k.act_isa
                );
            }
        }
        s
    }
}

/// Blocks from bytes: borrowed when aligned (always, for tensor data), else copied.
fn read_blocks<B: Block>(bytes: &[u8]) -> Cow<'_, [B]> {
    match blocks::<B>(bytes) {
        Ok(b) => Cow::Borrowed(b),
        Err(CastError::Alignment { .. }) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
        Err(e) => panic!("{e}"),
    }
}

/// Quantize `x` into the blocks laid over `y`, through a copy if `y` is not aligned for them.
fn write_blocks<B: Block>(x: &[f32], y: &mut [u8], quantize: impl Fn(&[f32], &mut [B])) {
    match blocks_mut::<B>(y) {
        Ok(out) => quantize(x, out),
        Err(CastError::Alignment { .. }) => {
            let mut out = vec![B::zeroed(); y.len() / size_of::<B>()];
            quantize(x, &mut out);
            y.copy_from_slice(as_bytes(&out));
        }
        Err(e) => panic!("{e}"),
    }
}

/// Panics unless `n` elements are a whole number of blocks of `qk` on both sides.
fn check_dot(name: &str, n: usize, qk: usize, nx: usize, ny: usize) {
    assert!(
        n.is_multiple_of(qk),
        "{name}: n = {n} is not a multiple of {qk}"
    );
    assert!(
        nx == n / qk && ny == n / qk,
        "{name}: n = {n} needs {} blocks on each side, got {nx} and {ny}",
        n / qk
    );
}

/// A dot-product kernel: one weight type, one instruction set, one way of using it.
#[derive(Clone, Copy)]
pub struct DotKernel {
    /// `scalar`, or the instruction set's name, with a suffix where the set has more than one
    /// kernel for the type (`avx512vnni_ymm`: VNNI on 32-byte registers).
    pub name: &'static str,
    /// The instruction set the kernel needs.
    pub isa: Isa,
    /// The kernel set that uses it for `ty` as its own, if any (others are kept to be
    /// measured against it).
    pub used_by: Option<Isa>,
    pub ty: GgmlType,
    pub vec_dot: VecDot,
}

impl fmt::Debug for DotKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DotKernel")
            .field("name", &self.name)
            .field("isa", &self.isa)
            .field("used_by", &self.used_by)
            .field("ty", &self.ty)
            .finish_non_exhaustive()
    }
}

/// Every dot-product kernel for `ty` this CPU can run: chapter 6's scalar one first, then the
/// SIMD ones, whether a set uses them or not.
pub fn dot_kernels(ty: GgmlType) -> Vec<DotKernel> {
    let scalar = type_traits(ty).and_then(|t| t.vec_dot).map(|f| DotKernel {
        name: "scalar",
        isa: Isa::Scalar,
        used_by: Some(Isa::Scalar),
        ty,
        vec_dot: f,
    });
    let simd = table::DOTS
        .iter()
        .filter(|k| k.ty == ty && k.isa.is_available())
        .copied();
    scalar.into_iter().chain(simd).collect()
}

/// An activation quantizer of an instruction set.
#[derive(Clone, Copy)]
struct QuantizeKernel {
    isa: Isa,
    /// The activation type.
    ty: GgmlType,
    quantize: FromFloat,
}

/// The SIMD kernels as byte-level functions: safe functions over the entry points of
/// [`crate::simd`], handed out only for instruction sets the CPU has ([`dot_kernels`] and
/// [`KernelSet::get`] check).
mod table {
    #[allow(unused_imports)]
    use super::*;

    /// A safe `VecDot` over a block kernel.
    #[allow(unused_macros)]
    macro_rules! dot {
        ($kernel:path, $w:ty, $a:ty) => {{
            fn f(n: usize, w: &[u8], a: &[u8]) -> f32 {
                let (w, a) = (read_blocks::<$w>(w), read_blocks::<$a>(a));
                check_dot(
                    stringify!($kernel),
                    n,
                    <$w as Block>::BLOCK_SIZE,
                    w.len(),
                    a.len(),
                );
                // SAFETY: the tables are read only for kernels whose instruction set the CPU
                // has (`dot_kernels`, `KernelSet::get`).
                unsafe { $kernel(&w, &a) }
            }
            f as VecDot
        }};
    }

    /// A safe `VecDot` over a row kernel (F32, F16, BF16), which checks its own lengths.
    #[allow(unused_macros)]
    macro_rules! row_dot {
        ($kernel:path) => {{
            fn f(n: usize, w: &[u8], a: &[u8]) -> f32 {
                // SAFETY: as for `dot!`.
                unsafe { $kernel(n, w, a) }
            }
            f as VecDot
        }};
    }

    /// A safe `FromFloat` over an activation quantizer.
    #[allow(unused_macros)]
    macro_rules! quantize {
        ($kernel:path, $b:ty) => {{
            fn f(x: &[f32], y: &mut [u8]) {
                // SAFETY: as for `dot!`.
                write_blocks::<$b>(x, y, |x, y| unsafe { $kernel(x, y) })
            }
            f as FromFloat
        }};
    }

    /// One line of a table: `kernel!(name, needs, used by, type, function)`.
    #[allow(unused_macros)]
    macro_rules! kernel {
        ($name:literal, $isa:ident, $used_by:expr, $ty:ident, $f:expr) => {
            DotKernel {
                name: $name,
                isa: Isa::$isa,
                used_by: $used_by,
                ty: GgmlType::$ty,
                vec_dot: $f,
            }
        };
    }

    #[cfg(target_arch = "x86_64")]
    mod arch {
        use super::*;
        use crate::simd::x86::{avx2, avx512, avx512vnni, avx512vnni::ymm};
        use ch06::quants::blocks::*;

        const AVX2: Option<Isa> = Some(Isa::Avx2);
        const AVX512: Option<Isa> = Some(Isa::Avx512);
        const VNNI: Option<Isa> = Some(Isa::Avx512Vnni);

        /// Every x86 dot product, and which set uses it. The choices come from
        /// `cargo bench -p ch08 --bench kernels` on an AMD Zen 4 (which runs a 64-byte
        /// instruction as two 32-byte halves): 64-byte registers win for Q5_0 (its fifth bits
        /// become bytes in one instruction), Q6_K and Q4_K; they lose for Q4_0, Q4_1 and Q8_0,
        /// whose two blocks per register cost more to gather than the wider arithmetic saves.
        pub(in super::super) static DOTS: &[DotKernel] = &[
            kernel!("avx2", Avx2, AVX2, F32, row_dot!(avx2::vec_dot_f32)),
            kernel!("avx2", Avx2, AVX2, F16, row_dot!(avx2::vec_dot_f16)),
            kernel!("avx2", Avx2, AVX2, BF16, row_dot!(avx2::vec_dot_bf16)),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q4_0,
                dot!(avx2::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q4_1,
                dot!(avx2::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q5_0,
                dot!(avx2::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q5_1,
                dot!(avx2::vec_dot_q5_1_q8_1, BlockQ5_1, BlockQ8_1)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q8_0,
                dot!(avx2::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q2_K,
                dot!(avx2::vec_dot_q2_K_q8_K, BlockQ2_K, BlockQ8_K)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q3_K,
                dot!(avx2::vec_dot_q3_K_q8_K, BlockQ3_K, BlockQ8_K)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q4_K,
                dot!(avx2::vec_dot_q4_K_q8_K, BlockQ4_K, BlockQ8_K)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q5_K,
                dot!(avx2::vec_dot_q5_K_q8_K, BlockQ5_K, BlockQ8_K)
            ),
            kernel!(
                "avx2",
                Avx2,
                AVX2,
                Q6_K,
                dot!(avx2::vec_dot_q6_K_q8_K, BlockQ6_K, BlockQ8_K)
            ),
            //
            kernel!("avx512", Avx512, AVX512, F32, row_dot!(avx512::vec_dot_f32)),
            kernel!(
                "avx512",
                Avx512,
                None,
                Q4_0,
                dot!(avx512::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "avx512",
                Avx512,
                None,
                Q4_1,
                dot!(avx512::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "avx512",
                Avx512,
                AVX512,
                Q5_0,
                dot!(avx512::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "avx512",
                Avx512,
                None,
                Q8_0,
                dot!(avx512::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
            kernel!(
                "avx512",
                Avx512,
                AVX512,
                Q4_K,
                dot!(avx512::vec_dot_q4_K_q8_K, BlockQ4_K, BlockQ8_K)
            ),
            kernel!(
                "avx512",
                Avx512,
                AVX512,
                Q6_K,
                dot!(avx512::vec_dot_q6_K_q8_K, BlockQ6_K, BlockQ8_K)
            ),
            //
            kernel!(
                "avx512vnni",
                Avx512Vnni,
                None,
                Q4_0,
                dot!(avx512vnni::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "avx512vnni",
                Avx512Vnni,
                None,
                Q4_1,
                dot!(avx512vnni::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "avx512vnni",
                Avx512Vnni,
                VNNI,
                Q5_0,
                dot!(avx512vnni::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "avx512vnni",
                Avx512Vnni,
                None,
                Q8_0,
                dot!(avx512vnni::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
            kernel!(
                "avx512vnni_ymm",
                Avx512Vnni,
                VNNI,
                Q4_0,
                dot!(ymm::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "avx512vnni_ymm",
                Avx512Vnni,
                VNNI,
                Q4_1,
                dot!(ymm::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "avx512vnni_ymm",
                Avx512Vnni,
                None,
                Q5_0,
                dot!(ymm::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "avx512vnni_ymm",
                Avx512Vnni,
                VNNI,
                Q5_1,
                dot!(ymm::vec_dot_q5_1_q8_1, BlockQ5_1, BlockQ8_1)
            ),
            kernel!(
                "avx512vnni_ymm",
                Avx512Vnni,
                VNNI,
                Q8_0,
                dot!(ymm::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
        ];

        /// The x86 activation quantizers. The AVX-512 sets have their own for Q8_0 and Q8_1:
        /// a prompt's or a batch's rows are quantized before every product, several per cent
        /// of a prefill with AVX2's. Q8_K (the k-quants' activations) stays AVX2's.
        pub(in super::super) static QUANTIZERS: &[QuantizeKernel] = &[
            QuantizeKernel {
                isa: Isa::Avx512,
                ty: GgmlType::Q8_0,
                quantize: quantize!(avx512::quantize_row_q8_0, BlockQ8_0),
            },
            QuantizeKernel {
                isa: Isa::Avx512,
                ty: GgmlType::Q8_1,
                quantize: quantize!(avx512::quantize_row_q8_1, BlockQ8_1),
            },
            QuantizeKernel {
                isa: Isa::Avx2,
                ty: GgmlType::Q8_0,
                quantize: quantize!(avx2::quantize_row_q8_0, BlockQ8_0),
            },
            QuantizeKernel {
                isa: Isa::Avx2,
                ty: GgmlType::Q8_1,
                quantize: quantize!(avx2::quantize_row_q8_1, BlockQ8_1),
            },
            QuantizeKernel {
                isa: Isa::Avx2,
                ty: GgmlType::Q8_K,
                quantize: quantize!(avx2::quantize_row_q8_K, BlockQ8_K),
            },
        ];
    }

    #[cfg(target_arch = "aarch64")]
    mod arch {
        use super::*;
        use crate::simd::arm::{neon, neondotprod};
        use ch06::quants::blocks::*;

        const NEON: Option<Isa> = Some(Isa::Neon);
        const DOTPROD: Option<Isa> = Some(Isa::NeonDotprod);

        /// Every AArch64 dot product; each set uses its own.
        pub(in super::super) static DOTS: &[DotKernel] = &[
            kernel!("neon", Neon, NEON, F32, row_dot!(neon::vec_dot_f32)),
            kernel!("neon", Neon, NEON, F16, row_dot!(neon::vec_dot_f16)),
            kernel!("neon", Neon, NEON, BF16, row_dot!(neon::vec_dot_bf16)),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q4_0,
                dot!(neon::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q4_1,
                dot!(neon::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q5_0,
                dot!(neon::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q5_1,
                dot!(neon::vec_dot_q5_1_q8_1, BlockQ5_1, BlockQ8_1)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q8_0,
                dot!(neon::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q2_K,
                dot!(neon::vec_dot_q2_K_q8_K, BlockQ2_K, BlockQ8_K)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q3_K,
                dot!(neon::vec_dot_q3_K_q8_K, BlockQ3_K, BlockQ8_K)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q4_K,
                dot!(neon::vec_dot_q4_K_q8_K, BlockQ4_K, BlockQ8_K)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q5_K,
                dot!(neon::vec_dot_q5_K_q8_K, BlockQ5_K, BlockQ8_K)
            ),
            kernel!(
                "neon",
                Neon,
                NEON,
                Q6_K,
                dot!(neon::vec_dot_q6_K_q8_K, BlockQ6_K, BlockQ8_K)
            ),
            //
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q4_0,
                dot!(neondotprod::vec_dot_q4_0_q8_0, BlockQ4_0, BlockQ8_0)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q4_1,
                dot!(neondotprod::vec_dot_q4_1_q8_1, BlockQ4_1, BlockQ8_1)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q5_0,
                dot!(neondotprod::vec_dot_q5_0_q8_0, BlockQ5_0, BlockQ8_0)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q5_1,
                dot!(neondotprod::vec_dot_q5_1_q8_1, BlockQ5_1, BlockQ8_1)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q8_0,
                dot!(neondotprod::vec_dot_q8_0_q8_0, BlockQ8_0, BlockQ8_0)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q2_K,
                dot!(neondotprod::vec_dot_q2_K_q8_K, BlockQ2_K, BlockQ8_K)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q3_K,
                dot!(neondotprod::vec_dot_q3_K_q8_K, BlockQ3_K, BlockQ8_K)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q4_K,
                dot!(neondotprod::vec_dot_q4_K_q8_K, BlockQ4_K, BlockQ8_K)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q5_K,
                dot!(neondotprod::vec_dot_q5_K_q8_K, BlockQ5_K, BlockQ8_K)
            ),
            kernel!(
                "neondotprod",
                NeonDotprod,
                DOTPROD,
                Q6_K,
                dot!(neondotprod::vec_dot_q6_K_q8_K, BlockQ6_K, BlockQ8_K)
            ),
        ];

        /// The NEON activation quantizers (`sdot` has nothing to add to them).
        pub(in super::super) static QUANTIZERS: &[QuantizeKernel] = &[
            QuantizeKernel {
                isa: Isa::Neon,
                ty: GgmlType::Q8_0,
                quantize: quantize!(neon::quantize_row_q8_0, BlockQ8_0),
            },
            QuantizeKernel {
                isa: Isa::Neon,
                ty: GgmlType::Q8_1,
                quantize: quantize!(neon::quantize_row_q8_1, BlockQ8_1),
            },
            QuantizeKernel {
                isa: Isa::Neon,
                ty: GgmlType::Q8_K,
                quantize: quantize!(neon::quantize_row_q8_K, BlockQ8_K),
            },
        ];
    }

    /// No SIMD kernels on other architectures.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    mod arch {
        use super::*;
        pub(in super::super) static DOTS: &[DotKernel] = &[];
        pub(in super::super) static QUANTIZERS: &[QuantizeKernel] = &[];
    }

    pub(super) use arch::{DOTS, QUANTIZERS};
}
