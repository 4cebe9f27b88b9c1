//! A table of the kernels per type, in the spirit of ggml's `type_traits` (`ggml.c`) and
//! `type_traits_cpu` (`ggml-cpu.c`), and the chunk-level quantizers `llama_model_quantize`
//! reaches through `ggml_quantize_chunk`.
//!
//! The table works on bytes, the way a model stores its tensors, so a matrix-vector product
//! can pick its kernels from a tensor's type at run time. The lengths are checked once, when a
//! tensor is loaded ([`check_row`]); the table's functions then only assert them.

use super::blocks::*;
use super::float::*;
use super::k_quants::*;
use super::legacy::*;
use ch01::GgmlType;
use std::borrow::Cow;
use std::fmt;
use std::mem::size_of;

// ANCHOR: type_traits
/// Dequantize a row (ggml's `ggml_to_float_t`): bytes of `n / block_size` blocks → `n` floats.
pub type ToFloat = fn(&[u8], &mut [f32]);
/// Quantize a row (ggml's `ggml_from_float_t`): `n` floats → bytes.
pub type FromFloat = fn(&[f32], &mut [u8]);
/// One weight row · one activation row of `n` elements (ggml's `ggml_vec_dot_t`).
pub type VecDot = fn(n: usize, w: &[u8], act: &[u8]) -> f32;

/// The kernels of one weight type. A matrix-vector product quantizes the activation row once
/// with `type_traits(vec_dot_type).from_float`, then calls `vec_dot` once per weight row.
pub struct TypeTraits {
    pub ty: GgmlType,
    pub block_size: usize,
    pub type_size: usize,
    pub to_float: ToFloat,
    /// The quantizer `llama_model_quantize` uses (without an importance matrix).
    pub from_float: FromFloat,
    /// The format activations are quantized to before `vec_dot`.
    pub vec_dot_type: GgmlType,
    /// One weight row · one activation row in `vec_dot_type`, both of `n` elements; `None` for
    /// the types that only ever hold activations (Q8_1, Q8_K).
    pub vec_dot: Option<VecDot>,
}

/// The scalar reference kernels for `ty`, or `None` for a type this chapter does not implement
/// (the i-quants, the ternary and FP4 types, the integer types).
pub fn type_traits(ty: GgmlType) -> Option<&'static TypeTraits> {
    use GgmlType::*;
    Some(match ty {
        F32 => &F32_TRAITS,
        F16 => &F16_TRAITS,
        BF16 => &BF16_TRAITS,
        Q4_0 => &Q4_0_TRAITS,
        Q4_1 => &Q4_1_TRAITS,
        Q5_0 => &Q5_0_TRAITS,
        Q5_1 => &Q5_1_TRAITS,
        Q8_0 => &Q8_0_TRAITS,
        Q8_1 => &Q8_1_TRAITS,
        Q2_K => &Q2_K_TRAITS,
        Q3_K => &Q3_K_TRAITS,
        Q4_K => &Q4_K_TRAITS,
        Q5_K => &Q5_K_TRAITS,
        Q6_K => &Q6_K_TRAITS,
        Q8_K => &Q8_K_TRAITS,
        _ => return None,
    })
}
// ANCHOR_END: type_traits

/// The weight types: those with a dot product in [`type_traits`] (every type there but the
/// activation-only Q8_1 and Q8_K). The plain floats first, then the legacy and the k-quants in
/// id order. Every list of "each weight type" in the later chapters and the tests is this one.
pub const WEIGHT_TYPES: [GgmlType; 13] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

/// Blocks from bytes: borrowed when their address is aligned for `B` (a tensor's bytes are,
/// when the whole file is, as in a memory map), else copied.
fn read_blocks<B: Block>(bytes: &[u8]) -> Cow<'_, [B]> {
    match blocks::<B>(bytes) {
        Ok(b) => Cow::Borrowed(b),
        Err(CastError::Alignment { .. }) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
        Err(e) => panic!("{e}"),
    }
}

fn block_to_float<B: Block>(x: &[u8], y: &mut [f32]) {
    B::dequantize_row(&read_blocks::<B>(x), y)
}

fn block_from_float<B: Block>(x: &[f32], y: &mut [u8]) {
    match blocks_mut::<B>(y) {
        Ok(out) => B::quantize_row_ref(x, out),
        Err(CastError::Alignment { .. }) => {
            let mut out = vec![B::zeroed(); y.len() / size_of::<B>()];
            B::quantize_row_ref(x, &mut out);
            y.copy_from_slice(as_bytes(&out));
        }
        Err(e) => panic!("{e}"),
    }
}

macro_rules! quant_traits {
    ($name:ident, $block:ty, $act:ty, $dot:ident) => {
        static $name: TypeTraits = TypeTraits {
            ty: <$block as Block>::TYPE,
            block_size: <$block as Block>::BLOCK_SIZE,
            type_size: size_of::<$block>(),
            to_float: block_to_float::<$block>,
            from_float: block_from_float::<$block>,
            vec_dot_type: <$act as Block>::TYPE,
            vec_dot: Some(|n, w, a| $dot(n, &read_blocks::<$block>(w), &read_blocks::<$act>(a))),
        };
    };
    ($name:ident, $block:ty) => {
        static $name: TypeTraits = TypeTraits {
            ty: <$block as Block>::TYPE,
            block_size: <$block as Block>::BLOCK_SIZE,
            type_size: size_of::<$block>(),
            to_float: block_to_float::<$block>,
            from_float: block_from_float::<$block>,
            vec_dot_type: <$block as Block>::TYPE,
            vec_dot: None,
        };
    };
}

quant_traits!(Q4_0_TRAITS, BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0);
quant_traits!(Q4_1_TRAITS, BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1);
quant_traits!(Q5_0_TRAITS, BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0);
quant_traits!(Q5_1_TRAITS, BlockQ5_1, BlockQ8_1, vec_dot_q5_1_q8_1);
quant_traits!(Q8_0_TRAITS, BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0);
quant_traits!(Q8_1_TRAITS, BlockQ8_1);
quant_traits!(Q2_K_TRAITS, BlockQ2_K, BlockQ8_K, vec_dot_q2_K_q8_K);
quant_traits!(Q3_K_TRAITS, BlockQ3_K, BlockQ8_K, vec_dot_q3_K_q8_K);
quant_traits!(Q4_K_TRAITS, BlockQ4_K, BlockQ8_K, vec_dot_q4_K_q8_K);
quant_traits!(Q5_K_TRAITS, BlockQ5_K, BlockQ8_K, vec_dot_q5_K_q8_K);
quant_traits!(Q6_K_TRAITS, BlockQ6_K, BlockQ8_K, vec_dot_q6_K_q8_K);
quant_traits!(Q8_K_TRAITS, BlockQ8_K);

static F32_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F32,
    block_size: 1,
    type_size: 4,
    to_float: f32_to_float,
    from_float: f32_from_float,
    vec_dot_type: GgmlType::F32,
    vec_dot: Some(f32_vec_dot),
};

static F16_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F16,
    block_size: 1,
    type_size: 2,
    to_float: f16_to_float,
    from_float: f16_from_float,
    vec_dot_type: GgmlType::F16,
    vec_dot: Some(f16_vec_dot),
};

static BF16_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::BF16,
    block_size: 1,
    type_size: 2,
    to_float: bf16_to_float,
    from_float: bf16_from_float,
    vec_dot_type: GgmlType::BF16,
    vec_dot: Some(bf16_vec_dot),
};

/// Why a row or chunk cannot be (de)quantized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// This chapter has no kernels for the type.
    Unsupported(GgmlType),
    /// A row length that is not a whole number of blocks.
    PartialBlock { ty: GgmlType, n: usize },
    /// A buffer of the wrong size.
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Unsupported(ty) => write!(f, "no kernels for ggml type {}", ty.name()),
            QuantError::PartialBlock { ty, n } => write!(
                f,
                "a row of {n} elements is not a whole number of {} blocks ({} elements each)",
                ty.name(),
                ty.block_size()
            ),
            QuantError::Length {
                what,
                expected,
                got,
            } => write!(f, "{what} has {got} elements, expected {expected}"),
        }
    }
}

impl std::error::Error for QuantError {}

/// The kernels for `ty` and the bytes of a row of `n` elements, or why there are none.
pub fn check_row(ty: GgmlType, n: usize) -> Result<(&'static TypeTraits, usize), QuantError> {
    let traits = type_traits(ty).ok_or(QuantError::Unsupported(ty))?;
    if !n.is_multiple_of(traits.block_size) {
        return Err(QuantError::PartialBlock { ty, n });
    }
    Ok((traits, n / traits.block_size * traits.type_size))
}

// ANCHOR: quantize_chunk
/// `ggml_quantize_chunk` without an importance matrix: quantize `nrow` rows of `n_per_row`
/// floats from `src` into `dst`, returning the bytes written.
///
/// Without an importance matrix every `quantize_<type>` in ggml (Q4_0..Q8_0 and Q2_K..Q6_K)
/// calls its `quantize_row_<type>_ref`; the `_impl` searches (`make_qkx3_quants`,
/// `make_qp_quants`) run only with one. Blocks never span rows, so quantizing the whole chunk
/// as one long row, as ggml does, gives the same bytes as row by row.
pub fn quantize_chunk(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    nrow: usize,
    n_per_row: usize,
) -> Result<usize, QuantError> {
    let (traits, row_bytes) = check_row(ty, n_per_row)?;
    let n = nrow * n_per_row;
    if src.len() != n {
        return Err(QuantError::Length {
            what: "source",
            expected: n,
            got: src.len(),
        });
    }
    if dst.len() != nrow * row_bytes {
        return Err(QuantError::Length {
            what: "destination (bytes)",
            expected: nrow * row_bytes,
            got: dst.len(),
        });
    }
    (traits.from_float)(src, dst);
    Ok(dst.len())
}
// ANCHOR_END: quantize_chunk

macro_rules! chunk_quantizer {
    ($(#[$doc:meta])* $name:ident, $ty:ident) => {
        $(#[$doc])*
        ///
        /// Panics when `src` or `dst` do not hold `nrow` rows of `n_per_row` elements; see
        /// [`quantize_chunk`] for the checked form.
        pub fn $name(src: &[f32], dst: &mut [u8], nrow: usize, n_per_row: usize) -> usize {
            match quantize_chunk(GgmlType::$ty, src, dst, nrow, n_per_row) {
                Ok(n) => n,
                Err(e) => panic!("{}: {e}", stringify!($name)),
            }
        }
    };
}

chunk_quantizer!(
    /// ggml's `quantize_q4_0` without an importance matrix: `quantize_row_q4_0_ref`.
    quantize_q4_0, Q4_0
);
chunk_quantizer!(
    /// ggml's `quantize_q4_1` without an importance matrix: `quantize_row_q4_1_ref`.
    quantize_q4_1, Q4_1
);
chunk_quantizer!(
    /// ggml's `quantize_q5_0` without an importance matrix: `quantize_row_q5_0_ref`.
    quantize_q5_0, Q5_0
);
chunk_quantizer!(
    /// ggml's `quantize_q5_1` without an importance matrix: `quantize_row_q5_1_ref`.
    quantize_q5_1, Q5_1
);
chunk_quantizer!(
    /// ggml's `quantize_q8_0` (which ignores any importance matrix): `quantize_row_q8_0_ref`.
    quantize_q8_0, Q8_0
);
chunk_quantizer!(
    /// ggml's `quantize_q2_K` without an importance matrix: `quantize_row_q2_K_ref`.
    quantize_q2_K, Q2_K
);
chunk_quantizer!(
    /// ggml's `quantize_q3_K` without an importance matrix: `quantize_row_q3_K_ref`.
    quantize_q3_K, Q3_K
);
chunk_quantizer!(
    /// ggml's `quantize_q4_K` without an importance matrix: `quantize_row_q4_K_ref`.
    quantize_q4_K, Q4_K
);
chunk_quantizer!(
    /// ggml's `quantize_q5_K` without an importance matrix: `quantize_row_q5_K_ref`.
    quantize_q5_K, Q5_K
);
chunk_quantizer!(
    /// ggml's `quantize_q6_K` without an importance matrix: `quantize_row_q6_K_ref`.
    quantize_q6_K, Q6_K
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_ggml_sizes_and_vec_dot_types() {
        use GgmlType::*;
        let expect = [
            (F32, F32),
            (F16, F16),
            (BF16, BF16),
            (Q4_0, Q8_0),
            (Q4_1, Q8_1),
            (Q5_0, Q8_0),
            (Q5_1, Q8_1),
            (Q8_0, Q8_0),
            (Q2_K, Q8_K),
            (Q3_K, Q8_K),
            (Q4_K, Q8_K),
            (Q5_K, Q8_K),
            (Q6_K, Q8_K),
        ];
        for (ty, act) in expect {
            let t = type_traits(ty).unwrap();
            assert_eq!(t.ty, ty);
            assert_eq!(t.vec_dot_type, act, "{ty}");
            assert_eq!(t.block_size as u64, ty.block_size(), "{ty}");
            assert_eq!(t.type_size as u64, ty.type_size(), "{ty}");
            assert!(t.vec_dot.is_some(), "{ty}");
        }
        assert!(type_traits(IQ2_XXS).is_none());
        assert!(type_traits(Q8_K).unwrap().vec_dot.is_none());
    }

    #[test]
    fn weight_types_are_the_types_with_a_dot_product() {
        let with_dot: Vec<GgmlType> = GgmlType::ALL
            .into_iter()
            .filter(|&t| type_traits(t).is_some_and(|t| t.vec_dot.is_some()))
            .collect();
        let mut listed = WEIGHT_TYPES.to_vec();
        listed.sort_by_key(|t| t.id());
        assert_eq!(listed, with_dot);
    }

    #[test]
    fn misaligned_bytes_give_the_same_results() {
        let x: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
        let t = type_traits(GgmlType::Q4_K).unwrap();
        let row = 2 * t.type_size;
        let mut buf = vec![0u8; row + 1];
        (t.from_float)(&x, &mut buf[..row]);
        let aligned = buf[..row].to_vec();
        (t.from_float)(&x, &mut buf[1..]);
        assert_eq!(&buf[1..], &aligned[..]);
        let (mut a, mut b) = (vec![0f32; 512], vec![0f32; 512]);
        (t.to_float)(&aligned, &mut a);
        (t.to_float)(&buf[1..], &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn chunk_errors_name_the_problem() {
        let e = quantize_chunk(GgmlType::Q4_K, &[0.0; 576], &mut [0u8; 324], 1, 576).unwrap_err();
        assert!(
            e.to_string().contains("576") && e.to_string().contains("Q4_K"),
            "{e}"
        );
        let e = quantize_chunk(GgmlType::IQ2_XS, &[0.0; 256], &mut [], 1, 256).unwrap_err();
        assert_eq!(e, QuantError::Unsupported(GgmlType::IQ2_XS));
        let e = quantize_chunk(GgmlType::Q8_0, &[0.0; 64], &mut [0u8; 34], 1, 64).unwrap_err();
        assert!(e.to_string().contains("destination"), "{e}");
    }
}
