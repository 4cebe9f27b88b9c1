//! Choosing scales for the k-quants: the search functions of ggml's `ggml-quants.c`.
//!
//! Rounding `x / d` to the nearest code is easy; choosing `d` (and a min) is where the k-quants
//! earn their accuracy. Each function tries a handful of candidate scales around the obvious one
//! and keeps the one with the smallest weighted error. The float operations follow ggml's order
//! exactly: a different order gives a different last bit, which can flip a rounding and change
//! the bytes of a model.

// ANCHOR: nearest_int
/// Round to the nearest integer, ties to even, for `|fval| <= 4194303` (ggml's `nearest_int`).
///
/// Adding 1.5 * 2^23 pushes the fraction bits out of the f32 mantissa, so the FPU's own
/// round-to-nearest-even does the rounding and the integer is read from the low mantissa
/// bits. Out of range (ggml only asserts in debug builds) the result is garbage, but the same
/// garbage as ggml's, which keeps the bytes identical.
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}
// ANCHOR_END: nearest_int

/// Below this, a group of weights counts as all zero (ggml's `GROUP_MAX_EPS`).
pub const GROUP_MAX_EPS: f32 = 1e-15;

// ANCHOR: make_qx_quants
/// ggml's `make_qx_quants` with `rmse_type = 1`, the only kind its quantizers use: symmetric
/// codes `L[i] - nmax` in `-nmax..nmax`, weighted by `qw` or, without it, by `x[i]^2` (large
/// weights matter most). Returns the scale; the codes are written to `l` offset by `nmax`.
///
/// The first scale maps the largest-magnitude weight to `-nmax`; then 18 nearby scales
/// `-(nmax + 0.1 * is) / max` are tried, and each set of codes is scored by the least-squares
/// scale `sum(w x l) / sum(w l^2)`, whose error is smallest when `sum(w x l)^2 / sum(w l^2)`
/// is largest.
pub fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let weight = |i: usize| match qw {
        Some(qw) => qw[i],
        None => x[i] * x[i],
    };
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);

    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = code(iscale, x[i]);
        l[i] = (li + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    // ANCHOR_END: make_qx_quants
    // ANCHOR: make_qx_quants_search
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let li = code(iscale, x[i]);
            let w = weight(i);
            sumlx += w * x[i] * li as f32;
            suml2 += w * li as f32 * li as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l[i] = (code(iscale, x[i]) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}
// ANCHOR_END: make_qx_quants_search

/// ggml's `make_q3_quants` with `do_rmse = true` (as `quantize_row_q3_K_ref` calls it): start
/// from `-nmax / max`, then move single codes while that improves the weighted error
/// (weights `x^2`), for at most five passes. Codes are written offset by `nmax`.
pub fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = li as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

// ANCHOR: make_qkx2_quants
/// ggml's `make_qkx2_quants`: asymmetric codes `0..=nmax` for `x = scale * L - the_min`.
/// Returns `(scale, the_min)` with `the_min >= 0`.
///
/// Starts from the codes that span `[min(0, min x), max x]`, then tries `nstep + 1` scales
/// `(rmin + rdelta * is + nmax) / (max - min)`; for each set of codes it solves the weighted
/// least-squares fit of scale and min, and keeps the fit with the smallest weighted error
/// (absolute with `use_mad`, squared otherwise).
#[allow(clippy::too_many_arguments)] // ggml's signature, so the call sites read the same
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    // ANCHOR_END: make_qkx2_quants
    // ANCHOR: make_qkx2_quants_search
    let error = |diff: f32| if use_mad { diff.abs() } else { diff * diff };

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min));
        l[i] = li.clamp(0, nmax) as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * error(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let w = weights[i];
            let lf = li as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * error(diff);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}
// ANCHOR_END: make_qkx2_quants_search

// ANCHOR: get_scale_min_k4
/// Scale and min of sub-block `j` from the 12 packed bytes of `BlockQ4_K`/`BlockQ5_K` (ggml's
/// `get_scale_min_k4`). Sub-blocks 0-3 keep 6 bits in bytes 0-7; sub-blocks 4-7 keep their low
/// four bits in bytes 8-11 and their top two in the spare top bits of bytes 0-7.
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
// ANCHOR_END: get_scale_min_k4

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (2.4999, 2),
            (-7.6, -8),
            (4194303.0, 4194303),
            (-4194303.0, -4194303),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "nearest_int({x})");
        }
    }

    #[test]
    fn qkx2_fits_an_exact_grid_exactly() {
        // x = 0.25 * l - 1 for codes 0..=15: the fit must find scale 0.25 and min 1.
        let x: Vec<f32> = (0..32).map(|i| 0.25 * (i % 16) as f32 - 1.0).collect();
        let w = vec![1.0f32; 32];
        let mut l = [0u8; 32];
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
        assert!(
            (scale - 0.25).abs() < 1e-6 && (min - 1.0).abs() < 1e-6,
            "{scale} {min}"
        );
        for (i, &li) in l.iter().enumerate() {
            assert_eq!(li as usize, i % 16);
        }
    }

    #[test]
    fn qx_quants_of_zeros_are_zero() {
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(32, &[0.0; 16], &mut l, None), 0.0);
        assert_eq!(l, [0; 16]);
    }
}
