//! The one tensor comparison every check against llama.cpp goes through.
//!
//! An element passes when `|got - want| <= abs + rel * |want|` (numpy's `allclose` rule). The
//! tolerance is always a named constant at the call site whose comment says why it has that
//! size, like ggml's `MAX_DOT_PRODUCT_ERROR`. On failure the report names the tensor and its
//! shape, shows the first values of both sides, the largest absolute and relative errors, and
//! the first index (with its coordinates) where the two diverge.
//!
//! Sequences that must be equal element for element (token ids, tensor types, names) go through
//! [`assert_same_sequence`]: like `assert_eq!`, but the message names the first index where the
//! two differ and shows a few elements around it from both sides, not two whole lists.

use std::fmt;
use std::fmt::Write as _;

/// How far `got` may be from `want`, element-wise: `|got - want| <= abs + rel * |want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub abs: f32,
    pub rel: f32,
}

impl Tolerance {
    /// Bit-for-bit equality (NaN never equals anything).
    pub const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };

    pub const fn new(abs: f32, rel: f32) -> Tolerance {
        Tolerance { abs, rel }
    }

    fn allows(&self, got: f32, want: f32) -> bool {
        (got - want).abs() <= self.abs + self.rel * want.abs()
    }
}

/// Error statistics of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub len: usize,
    /// Largest `|got - want|`, and where.
    pub max_abs: f32,
    pub max_abs_at: usize,
    /// Largest `|got - want| / |want|` over elements with `want != 0`.
    pub max_rel: f32,
    /// Number of elements outside the tolerance.
    pub failures: usize,
    /// First element outside the tolerance.
    pub first_failure: Option<usize>,
}

/// A failed comparison, with everything needed to see what went wrong.
#[derive(Debug, Clone)]
pub struct Mismatch {
    pub name: String,
    pub shape: Vec<usize>,
    pub tol: Tolerance,
    pub report: Report,
    /// Set when the two sides differ in length; nothing else was compared.
    pub lengths: Option<(usize, usize)>,
    got_head: Vec<f32>,
    want_head: Vec<f32>,
    around: Vec<(usize, f32, f32)>,
}

const SHOW: usize = 6;

fn coords(shape: &[usize], mut index: usize) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            c[d] = index % n;
            index /= n;
        }
    }
    c
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "tensor {:?} (shape {:?}) does not match the reference",
            self.name, self.shape
        )?;
        if let Some((g, w)) = self.lengths {
            return write!(f, "  length differs: got {g} values, reference has {w}");
        }
        let r = &self.report;
        writeln!(
            f,
            "  tolerance: |got - want| <= {} + {} * |want|",
            self.tol.abs, self.tol.rel
        )?;
        writeln!(f, "  got  [..{SHOW}]: {:?}", self.got_head)?;
        writeln!(f, "  want [..{SHOW}]: {:?}", self.want_head)?;
        writeln!(
            f,
            "  max abs error {:e} at index {} {:?}; max rel error {:e}",
            r.max_abs,
            r.max_abs_at,
            coords(&self.shape, r.max_abs_at),
            r.max_rel
        )?;
        if let Some(i) = r.first_failure {
            writeln!(
                f,
                "  first divergence at index {i} {:?}; {} of {} elements outside tolerance",
                coords(&self.shape, i),
                r.failures,
                r.len
            )?;
            for &(j, g, w) in &self.around {
                writeln!(f, "    [{j}] got {g:e} want {w:e} diff {:e}", (g - w).abs())?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Mismatch {}

/// Compare `got` with the reference `want` (both row-major with `shape`).
pub fn compare(
    name: &str,
    shape: &[usize],
    got: &[f32],
    want: &[f32],
    tol: Tolerance,
) -> Result<Report, Box<Mismatch>> {
    let head = |v: &[f32]| v.iter().take(SHOW).copied().collect::<Vec<_>>();
    let mut report = Report {
        len: want.len(),
        max_abs: 0.0,
        max_abs_at: 0,
        max_rel: 0.0,
        failures: 0,
        first_failure: None,
    };
    if got.len() != want.len() {
        return Err(Box::new(Mismatch {
            name: name.into(),
            shape: shape.to_vec(),
            tol,
            report,
            lengths: Some((got.len(), want.len())),
            got_head: head(got),
            want_head: head(want),
            around: vec![],
        }));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        // NaN compares false everywhere, so test "passes" rather than "fails".
        if !tol.allows(g, w) {
            report.failures += 1;
            report.first_failure.get_or_insert(i);
        }
        if d > report.max_abs || d.is_nan() && !report.max_abs.is_nan() {
            report.max_abs = d;
            report.max_abs_at = i;
        }
        if w != 0.0 {
            report.max_rel = report.max_rel.max(d / w.abs());
        }
    }
    match report.first_failure {
        None => Ok(report),
        Some(i) => {
            let lo = i.saturating_sub(2);
            let hi = (i + 3).min(got.len());
            let around = (lo..hi).map(|j| (j, got[j], want[j])).collect();
            Err(Box::new(Mismatch {
                name: name.into(),
                shape: shape.to_vec(),
                tol,
                report,
                lengths: None,
                got_head: head(got),
                want_head: head(want),
                around,
            }))
        }
    }
}

/// [`compare`], panicking with the full report on a mismatch. Returns the error statistics so a
/// test can print how close it came.
#[track_caller]
pub fn assert_close(
    name: &str,
    shape: &[usize],
    got: &[f32],
    want: &[f32],
    tol: Tolerance,
) -> Report {
    match compare(name, shape, got, want, tol) {
        Ok(r) => r,
        Err(m) => panic!("{m}"),
    }
}

/// Elements shown on each side of the first difference of two sequences.
const AROUND: usize = 3;

/// Where `got` first differs from the reference `want`, as a message: the index (or, when one
/// is a prefix of the other, where the shorter ends), both lengths, and the elements from
/// [`AROUND`] before to [`AROUND`] after it on both sides. `None` when they are equal.
pub fn sequence_mismatch<T: PartialEq + fmt::Debug>(
    name: &str,
    got: &[T],
    want: &[T],
) -> Option<String> {
    let first = got.iter().zip(want).position(|(g, w)| g != w);
    let i = first.or((got.len() != want.len()).then(|| got.len().min(want.len())))?;
    let mut m = format!(
        "{name:?} differs from the reference at index {i} (got {} elements, reference {})\n",
        got.len(),
        want.len()
    );
    let show = |v: &[T], j: usize| v.get(j).map_or("(none)".to_string(), |x| format!("{x:?}"));
    let end = (i + AROUND + 1).min(got.len().max(want.len()));
    for j in i.saturating_sub(AROUND)..end {
        let mark = if j == i { "->" } else { "  " };
        let (g, w) = (show(got, j), show(want, j));
        let _ = writeln!(m, "  {mark} [{j}] got {g}, want {w}");
    }
    Some(m)
}

/// Panic with [`sequence_mismatch`]'s message unless `got` equals `want` element for element.
#[track_caller]
pub fn assert_same_sequence<T: PartialEq + fmt::Debug>(name: &str, got: &[T], want: &[T]) {
    if let Some(m) = sequence_mismatch(name, got, want) {
        panic!("{m}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance::new(1e-5, 1e-4);

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
    }

    #[test]
    fn identical_tensors_pass_with_zero_error() {
        let a = ramp(100);
        let r = assert_close("x", &[10, 10], &a, &a, Tolerance::EXACT);
        assert_eq!((r.max_abs, r.failures), (0.0, 0));
    }

    #[test]
    fn a_perturbed_tensor_fails_and_the_report_says_where() {
        let want = ramp(60);
        let mut got = want.clone();
        got[23] += 0.01;
        got[40] -= 0.5;
        let m = compare("l_out-3", &[6, 10], &got, &want, TOL).unwrap_err();
        assert_eq!(m.report.first_failure, Some(23));
        assert_eq!(m.report.failures, 2);
        assert_eq!(m.report.max_abs_at, 40);
        let text = m.to_string();
        for needle in [
            "l_out-3",
            "[6, 10]",
            "index 23 [2, 3]",
            "max abs error",
            "want [..6]",
        ] {
            assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
        }
    }

    #[test]
    fn perturbation_within_tolerance_passes() {
        let want = ramp(50);
        let got: Vec<f32> = want
            .iter()
            .map(|w| w + 0.5 * (TOL.abs + TOL.rel * w.abs()))
            .collect();
        let r = compare("x", &[50], &got, &want, TOL).unwrap();
        assert!(r.max_abs > 0.0);
    }

    #[test]
    fn nan_never_passes() {
        let want = ramp(8);
        let mut got = want.clone();
        got[5] = f32::NAN;
        let m = compare("x", &[8], &got, &want, Tolerance::new(1e9, 1e9)).unwrap_err();
        assert_eq!(m.report.first_failure, Some(5));
    }

    #[test]
    fn length_mismatch_fails() {
        let m = compare("x", &[3], &[1.0, 2.0], &[1.0, 2.0, 3.0], TOL).unwrap_err();
        assert_eq!(m.lengths, Some((2, 3)));
        assert!(m.to_string().contains("length differs"));
    }

    #[test]
    #[should_panic(expected = "does not match the reference")]
    fn assert_close_panics_with_the_report() {
        assert_close("x", &[2], &[0.0, 1.0], &[0.0, 2.0], TOL);
    }

    #[test]
    fn equal_sequences_have_no_mismatch() {
        let a: Vec<u32> = (0..64).collect();
        assert_eq!(sequence_mismatch("ids", &a, &a), None);
        assert_same_sequence("ids", &a, &a);
    }

    #[test]
    fn a_sequence_mismatch_names_the_first_difference_and_its_neighbours() {
        let want: Vec<u32> = (100..164).collect();
        let mut got = want.clone();
        got[17] = 9;
        got[40] = 9;
        let m = sequence_mismatch("greedy ids", &got, &want).unwrap();
        assert!(
            m.contains("at index 17 (got 64 elements, reference 64)"),
            "{m}"
        );
        assert!(m.contains("-> [17] got 9, want 117"), "{m}");
        for j in [14, 15, 16, 18, 19, 20] {
            let line = format!("   [{j}] got {}, want {}", 100 + j, 100 + j);
            assert!(m.contains(&line), "lacks {line:?}:\n{m}");
        }
        // A few lines, not the two whole lists.
        assert_eq!(m.lines().count(), 1 + 7, "{m}");
        assert!(
            !m.contains("[13]") && !m.contains("[21]") && !m.contains("[40]"),
            "{m}"
        );
    }

    #[test]
    fn a_sequence_that_stops_early_differs_where_it_ends() {
        let m = sequence_mismatch("ids", &[1, 2], &[1, 2, 3]).unwrap();
        assert!(
            m.contains("at index 2 (got 2 elements, reference 3)"),
            "{m}"
        );
        assert!(m.contains("-> [2] got (none), want 3"), "{m}");
        let m = sequence_mismatch("ids", &[0u8; 0], &[7]).unwrap();
        assert!(m.contains("-> [0] got (none), want 7"), "{m}");
    }

    #[test]
    #[should_panic(expected = "differs from the reference at index 1")]
    fn assert_same_sequence_panics_with_the_first_difference() {
        assert_same_sequence("types", &["F32", "Q8_0"], &["F32", "Q4_K"]);
    }
}
