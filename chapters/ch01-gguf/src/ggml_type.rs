//! ggml's tensor types: the numeric id a GGUF file stores for each tensor, and how many bytes a
//! row of `n` elements takes.
//!
//! Quantized types store weights in fixed-size *blocks*: `Q4_1` packs 32 weights into 20 bytes
//! (two f16 numbers and 32 four-bit codes). A tensor's rows must therefore hold a whole number of
//! blocks, and its size in bytes is `n_elements / block_size * type_size`. The table below is
//! ggml's `type_traits` (ggml.c) reduced to those two numbers, with the same ids as `enum
//! ggml_type` in ggml.h. Ids whose support ggml removed (4, 5, 31–33, 36–38) are not types here:
//! a file that uses one is rejected like any other unknown id.

use std::fmt;

// ANCHOR: ggml_type
/// A ggml tensor type, with the id GGUF files use for it (`GGML_TYPE_Q4_1 = 3`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}
// ANCHOR_END: ggml_type

/// Weights per block of the k-quants and most i-quants (ggml's `QK_K`).
pub const QK_K: u64 = 256;

impl GgmlType {
    // ANCHOR: layout
    /// `(elements per block, bytes per block)`, as in ggml's `type_traits`.
    const fn layout(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 2 + 16),
            Q4_1 => (32, 2 + 2 + 16),
            Q5_0 => (32, 2 + 4 + 16),
            Q5_1 => (32, 2 + 2 + 4 + 16),
            Q8_0 => (32, 2 + 32),
            Q8_1 => (32, 2 + 2 + 32),
            Q2_K => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (QK_K, 2 + 2 + QK_K / 2 + 12),
            Q5_K => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Q6_K => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => (QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (QK_K, 2 + QK_K / 4),
            IQ2_XS => (QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (32, 2 + 16),
            IQ3_S => (QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1_M => (QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => (1, 2),
            TQ1_0 => (QK_K, 2 + 4 * 13),
            TQ2_0 => (QK_K, 2 + 64),
            MXFP4 => (32, 1 + 16),
            NVFP4 => (64, 4 + 32),
            Q1_0 => (128, 2 + 16),
            Q2_0 => (64, 2 + 16),
        }
    }
    // ANCHOR_END: layout

    // ANCHOR: row_bytes

    /// Number of elements in one block (1 for the plain types).
    pub const fn block_size(self) -> u64 {
        self.layout().0
    }

    /// Number of bytes in one block.
    pub const fn type_size(self) -> u64 {
        self.layout().1
    }

    /// Bytes taken by `n_elements` of this type; `None` when `n_elements` is not a whole number of
    /// blocks or the size does not fit in a `u64`.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let (block, size) = self.layout();
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(size)
    }
    // ANCHOR_END: row_bytes

    /// Every type, in id order.
    pub const ALL: [GgmlType; 35] = {
        use GgmlType::*;
        [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
            IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64,
            IQ1_M, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0,
        ]
    };

    /// The type with ggml id `id`, or `None` for an unknown or removed id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The type named `name` (`"Q4_K"`, or `"q4_k"`: case is ignored, as `llama-quantize`'s
    /// `--tensor-type` ignores it), or `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// ggml's numeric id for this type.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The name GGUF tools print: `"Q4_1"`, `"F32"`, `"IQ2_XXS"`.
    pub const fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
            NVFP4 => "NVFP4",
            Q1_0 => "Q1_0",
            Q2_0 => "Q2_0",
        }
    }

    /// Whether the type stores blocks of scaled codes rather than plain numbers.
    pub const fn is_quantized(self) -> bool {
        !matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::F64
                | GgmlType::I8
                | GgmlType::I16
                | GgmlType::I32
                | GgmlType::I64
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t), "{t}");
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
        // ALL is in id order, so a type added in the wrong place shows up here.
        assert!(GgmlType::ALL.windows(2).all(|w| w[0].id() < w[1].id()));
    }

    #[test]
    fn names_round_trip_in_any_case() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_name(t.name()), Some(t), "{t}");
            assert_eq!(
                GgmlType::from_name(&t.name().to_lowercase()),
                Some(t),
                "{t}"
            );
        }
        for unknown in ["", "Q4", "Q4_K_M", "F32 ", "Q4_0x"] {
            assert_eq!(GgmlType::from_name(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn block_sizes_match_ggml_common_h() {
        // sizeof(block_q4_0) etc. from ggml-common.h, written out rather than derived.
        let expected = [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::IQ4_NL, 32, 18),
            (GgmlType::IQ1_M, 256, 56),
            (GgmlType::MXFP4, 32, 17),
            (GgmlType::BF16, 1, 2),
        ];
        for (t, block, size) in expected {
            assert_eq!((t.block_size(), t.type_size()), (block, size), "{t}");
        }
    }

    #[test]
    fn row_bytes_rejects_partial_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::Q8_0.row_bytes(0), Some(0));
    }
}
