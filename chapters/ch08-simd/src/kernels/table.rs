//! The SIMD kernels as byte-level functions: safe functions over the entry points of
//! [`crate::simd`], handed out only for instruction sets the CPU has ([`dot_kernels`] and
//! [`KernelSet::get`] check).
//!
//! One table per architecture lists every dot product ([`DotKernel`]) and activation quantizer
//! with the instruction set it needs and the kernel set that uses it, if any; the x86 table says
//! which measurements made its choices.
//!
//! [`KernelSet::get`]: super::KernelSet::get

use super::Isa;
use ch01::GgmlType;
use ch06::quants::{
    Block, CastError, FromFloat, VecDot, as_bytes, blocks, blocks_mut, type_traits,
};
use std::borrow::Cow;
use std::fmt;

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
    let simd = DOTS
        .iter()
        .filter(|k| k.ty == ty && k.isa.is_available())
        .copied();
    scalar.into_iter().chain(simd).collect()
}

/// An activation quantizer of an instruction set.
#[derive(Clone, Copy)]
pub(super) struct QuantizeKernel {
    pub(super) isa: Isa,
    /// The activation type.
    pub(super) ty: GgmlType,
    pub(super) quantize: FromFloat,
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
