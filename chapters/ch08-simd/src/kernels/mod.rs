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
//! and the table records which one each set uses.
//!
//! # The files
//!
//! - this one: [`KernelSet`], choosing the set and, for each weight type, its kernels
//!   ([`TypeKernels`]);
//! - `isa.rs`: [`Isa`], the instruction sets, and asking the CPU which it has;
//! - `table.rs`: every SIMD kernel as a safe byte-level function ([`DotKernel`]), and which set
//!   uses which.

use ch01::GgmlType;
use ch06::quants::{FromFloat, VecDot, type_traits};
use std::fmt;
use std::sync::OnceLock;

mod isa;
mod table;

pub use isa::{Isa, KERNELS_ENV};
pub use table::{DotKernel, dot_kernels};

/// The weight types with kernels, in the order [`KernelSet::describe`] lists them: chapter 6's
/// list, since every type with a scalar kernel has a kernel in every set (its own, or one from
/// the set below it).
use ch06::quants::WEIGHT_TYPES;

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
