//! Properties of softmax, RoPE and attention that hold for any input.

use ch01::config::RopeStyle;
use ch03::attention::{Attention, AttentionWeights, AttnBias, TokenPos};
use ch03::{DenseMatrix, KvStore, NoObserver, Recorder, RopeScale, RopeTable, VecKv, softmax};
use proptest::prelude::*;

/// f32 sums of a few hundred terms: relative rounding error stays far below this.
const PROP_TOL: f32 = 1e-4;
/// RoPE against its formula evaluated in f64, for values in (-4, 4) at positions below 128: the
/// table's angles are multiplied in f32 (as llama.cpp does), a relative error of a few 1e-6 on
/// angles up to 128 radians, which moves a rotated value by a few 1e-4 at most. An angle one
/// position off, or a pair's frequency wrong, moves the fastest pairs by a radian.
const ROPE_TOL: f32 = 1e-3;

fn vec_of(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-4.0f32..4.0, n)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn softmax_sums_to_one_and_ignores_shifts(x in prop::collection::vec(-50.0f32..50.0, 1..200), shift in -100.0f32..100.0) {
        let mut a = x.clone();
        softmax(&mut a);
        let sum: f32 = a.iter().sum();
        prop_assert!((sum - 1.0).abs() < PROP_TOL, "sum {sum}");
        prop_assert!(a.iter().all(|&p| (0.0..=1.0).contains(&p)));
        let mut b: Vec<f32> = x.iter().map(|v| v + shift).collect();
        softmax(&mut b);
        for (p, q) in a.iter().zip(&b) {
            prop_assert!((p - q).abs() < PROP_TOL, "{p} vs {q}");
        }
    }

    #[test]
    fn rope_preserves_norms(x in vec_of(64 * 3), pos in 0usize..500, neox in any::<bool>()) {
        let style = if neox { RopeStyle::Neox } else { RopeStyle::Normal };
        let rope = RopeTable::new(64, 10000.0, 1.0, style, 512);
        let mut y = x.clone();
        rope.apply(&mut y, 64, pos);
        for h in 0..3 {
            let (a, b) = (&x[h * 64..(h + 1) * 64], &y[h * 64..(h + 1) * 64]);
            let (na, nb) = (dot(a, a).sqrt(), dot(b, b).sqrt());
            prop_assert!((na - nb).abs() <= PROP_TOL * na.max(1.0), "{na} vs {nb}");
        }
    }

    #[test]
    fn rotated_dot_products_depend_only_on_relative_position(
        q in vec_of(64), k in vec_of(64), p in 0usize..200, m in 0usize..200, shift in 0usize..200, neox in any::<bool>()
    ) {
        let style = if neox { RopeStyle::Neox } else { RopeStyle::Normal };
        let rope = RopeTable::new(64, 10000.0, 1.0, style, 1024);
        let score = |qp: usize, kp: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope.apply(&mut a, 64, qp);
            rope.apply(&mut b, 64, kp);
            dot(&a, &b)
        };
        let (s1, s2) = (score(p, m), score(p + shift, m + shift));
        // the angles are rounded to f32, and their error grows with the position
        let scale = dot(&q, &q).sqrt() * dot(&k, &k).sqrt();
        prop_assert!((s1 - s2).abs() <= 1e-3 * scale.max(1.0), "{s1} vs {s2}");
    }
}

/// One head of RoPE by its definition, in f64: pair `i` (of `n_rot / 2`) turns by
/// `p · base^(-2i/n_rot) · freq_scale / freq_factors[i]`; the values past `n_rot` stay.
fn rope_by_definition(
    x: &[f32],
    n_rot: usize,
    style: RopeStyle,
    pos: usize,
    scale: &RopeScale,
) -> Vec<f32> {
    let (base, half) = (10000.0f64, n_rot / 2);
    let mut y = x.to_vec();
    for i in 0..half {
        let factor = scale.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
        let theta =
            pos as f64 * base.powf(-2.0 * i as f64 / n_rot as f64) * scale.freq_scale as f64
                / factor;
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (x[a] as f64, x[b] as f64);
        y[a] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
        y[b] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
    }
    y
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// What the table holds and which values `apply` pairs, against the formula: the cosine and
    /// then the sine of `p · θ_i`, counted from position 0, with the scaling the table was made
    /// with (a linear factor and per-pair frequency factors, as Llama 3 files have), rotating
    /// `n_rot / 2` pairs of each head and leaving the rest of the head as it is.
    #[test]
    fn rope_rotates_each_pair_by_position_times_its_frequency(
        x in vec_of(64 * 2), pos in 0usize..128, neox in any::<bool>(), rot in 0usize..3, scaled in any::<bool>()
    ) {
        let (head_dim, n_rot) = (64, [16, 32, 64][rot]);
        let style = if neox { RopeStyle::Neox } else { RopeStyle::Normal };
        let mut scale = RopeScale::linear(1.0);
        if scaled {
            scale.freq_scale = 0.5;
            scale.freq_factors = Some((0..n_rot / 2).map(|i| 1.0 + i as f32 / 4.0).collect());
        }
        let rope = RopeTable::scaled(n_rot, 10000.0, style, scale.clone(), 128);
        let mut y = x.clone();
        rope.apply(&mut y, head_dim, pos);
        for h in 0..2 {
            let head = h * head_dim..(h + 1) * head_dim;
            let want = rope_by_definition(&x[head.clone()], n_rot, style, pos, &scale);
            for (d, (got, want)) in y[head].iter().zip(&want).enumerate() {
                prop_assert!(
                    (got - want).abs() <= ROPE_TOL,
                    "head {h} value {d} (n_rot {n_rot}, {style:?}, position {pos}, scaled {scaled}): {got}, the formula gives {want}"
                );
            }
        }
    }
}

fn dense(rows: usize, cols: usize, seed: u32) -> Box<DenseMatrix> {
    let data = (0..rows * cols)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect();
    Box::new(DenseMatrix::new(data, rows, cols))
}

/// Run one attention layer over `n` tokens of random input; return the output.
fn run(att: &Attention, w: &AttentionWeights, x: &[f32], n: usize) -> Vec<f32> {
    let mut kv = VecKv::new(1, att.kv_dim());
    let tokens = TokenPos::run(0, 0, n);
    kv.reserve(0, 0..n).unwrap();
    let mut out = vec![0.0; x.len()];
    att.forward(w, 0, x, &tokens, &mut kv, &mut NoObserver, &mut out);
    out
}

#[test]
fn gqa_with_as_many_kv_heads_as_query_heads_is_multi_head_attention() {
    // 4 query heads sharing 2 KV heads, against 4 query heads with 4 KV heads where each KV head
    // is duplicated from the shared one: the same computation written two ways.
    let (d, hd, n) = (32, 8, 5);
    let rope = || RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, 64);
    let gqa = Attention {
        n_head: 4,
        n_head_kv: 2,
        head_dim: hd,
        rope: rope(),
        window: None,
        kq_scale: Attention::standard_scale(hd),
    };
    let mha = Attention {
        n_head: 4,
        n_head_kv: 4,
        head_dim: hd,
        rope: rope(),
        window: None,
        kq_scale: Attention::standard_scale(hd),
    };
    let (wk, wv) = (dense(2 * hd, d, 2), dense(2 * hd, d, 3)); // `dense` is deterministic
    let dup = |m: &DenseMatrix| {
        // KV head j of the MHA layer = KV head j / 2 of the GQA layer
        let mut data = Vec::new();
        for j in 0..4 {
            data.extend_from_slice(&m.data()[(j / 2) * hd * d..(j / 2 + 1) * hd * d]);
        }
        Box::new(DenseMatrix::new(data, 4 * hd, d))
    };
    let w_gqa = AttentionWeights {
        wq: dense(4 * hd, d, 1),
        wk: dense(2 * hd, d, 2),
        wv: dense(2 * hd, d, 3),
        wo: dense(d, 4 * hd, 4),
        bias: AttnBias::default(),
    };
    let w_mha = AttentionWeights {
        wq: dense(4 * hd, d, 1),
        wk: dup(&wk),
        wv: dup(&wv),
        wo: dense(d, 4 * hd, 4),
        bias: AttnBias::default(),
    };
    let x: Vec<f32> = (0..n * d)
        .map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0)
        .collect();
    let (a, b) = (run(&gqa, &w_gqa, &x, n), run(&mha, &w_mha, &x, n));
    testkit::assert_close(
        "gqa vs mha",
        &[n, d],
        &a,
        &b,
        testkit::Tolerance::new(1e-6, 1e-5),
    );
}

#[test]
fn causal_mask_hides_the_future_and_sliding_window_the_distant_past() {
    let (d, hd, n) = (16, 8, 6);
    let mut att = Attention {
        n_head: 2,
        n_head_kv: 1,
        head_dim: hd,
        rope: RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, 64),
        window: None,
        kq_scale: Attention::standard_scale(hd),
    };
    let w = AttentionWeights {
        wq: dense(2 * hd, d, 1),
        wk: dense(hd, d, 2),
        wv: dense(hd, d, 3),
        wo: dense(d, 2 * hd, 4),
        bias: AttnBias::default(),
    };
    let x: Vec<f32> = (0..n * d)
        .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let full = run(&att, &w, &x, n);
    // Changing the last token must not change the outputs of earlier tokens.
    let mut x2 = x.clone();
    for v in &mut x2[(n - 1) * d..] {
        *v += 1.0;
    }
    let changed = run(&att, &w, &x2, n);
    assert_eq!(&full[..(n - 1) * d], &changed[..(n - 1) * d]);
    assert_ne!(&full[(n - 1) * d..], &changed[(n - 1) * d..]);

    // With a window of 2, the first token no longer influences token 3.
    att.window = Some(2);
    let mut kv = VecKv::new(1, att.kv_dim());
    kv.reserve(0, 0..n).unwrap();
    let mut rec = Recorder::only(&["kq_soft_max-0"]);
    let mut out = vec![0.0; x.len()];
    att.forward(
        &w,
        0,
        &x,
        &TokenPos::run(0, 0, n),
        &mut kv,
        &mut rec,
        &mut out,
    );
    let (shape, probs) = rec.get("kq_soft_max-0");
    assert_eq!(shape, &[2, n, n]);
    for h in 0..2 {
        for i in 0..n {
            let row = &probs[(h * n + i) * n..(h * n + i + 1) * n];
            for (j, &p) in row.iter().enumerate() {
                let visible = j <= i && j + 2 > i;
                assert_eq!(p > 0.0, visible, "head {h} query {i} key {j}: {p}");
            }
        }
    }
}

/// The attention of one query head `h` by its definition, in f64: the softmax of
/// `q_h · k_j · kq_scale` over the positions `visible`, weighting their values; query head `h`
/// reads KV head `h / (n_head / n_head_kv)`.
fn attention_by_definition(
    att: &Attention,
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    visible: std::ops::Range<usize>,
) -> Vec<f32> {
    let hd = att.head_dim;
    let group = att.n_head / att.n_head_kv;
    let mut out = vec![0.0; att.q_dim()];
    for h in 0..att.n_head {
        let (q_h, kv) = (
            &q[h * hd..(h + 1) * hd],
            (h / group) * hd..(h / group + 1) * hd,
        );
        let scores: Vec<f64> = visible
            .clone()
            .map(|j| {
                let k = &keys[j][kv.clone()];
                q_h.iter()
                    .zip(k)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * att.kq_scale as f64
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        for (s, j) in scores.iter().zip(visible.clone()) {
            let p = (s - max).exp() / sum;
            for (o, v) in out[h * hd..(h + 1) * hd]
                .iter_mut()
                .zip(&values[j][kv.clone()])
            {
                *o += (p * *v as f64) as f32;
            }
        }
    }
    out
}

/// A small grouped-query attention (4 query heads over 2 KV heads) with a sliding window.
fn small_attention(window: Option<usize>) -> Attention {
    let hd = 8;
    Attention {
        n_head: 4,
        n_head_kv: 2,
        head_dim: hd,
        rope: RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, 64),
        window,
        kq_scale: Attention::standard_scale(hd),
    }
}

/// A store holding `keys` and `values` of sequence 0, layer 0.
fn store(att: &Attention, keys: &[Vec<f32>], values: &[Vec<f32>]) -> VecKv {
    let mut kv = VecKv::new(1, att.kv_dim());
    kv.reserve(0, 0..keys.len()).unwrap();
    for (pos, (k, v)) in keys.iter().zip(values).enumerate() {
        kv.store(0, 0, pos, k, v);
    }
    kv
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `attend` over the positions `visible` of a store, against the definition, with every
    /// other position's key and value NaN: a query reads the window it is given and nothing
    /// else, whichever position the window starts at.
    #[test]
    fn attend_is_the_definition_over_the_visible_positions_only(
        n_pos in 1usize..10, window in prop::option::of(1usize..6), at in 0usize..10, seed in vec_of(4 * 8 + 2 * 10 * 2 * 8)
    ) {
        let att = small_attention(window);
        let (qd, kvd) = (att.q_dim(), att.kv_dim());
        let pos = at % n_pos;
        let visible = att.visible(pos, 0);
        let q: Vec<f32> = seed[..qd].iter().map(|v| v / 4.0).collect();
        let rows = |from: usize| -> Vec<Vec<f32>> {
            (0..n_pos).map(|j| seed[from + j * kvd..from + (j + 1) * kvd].iter().map(|v| v / 4.0).collect()).collect()
        };
        let (keys, values) = (rows(qd), rows(qd + 10 * kvd));
        let want = attention_by_definition(&att, &q, &keys, &values, visible.clone());
        let hidden = |rows: &[Vec<f32>]| -> Vec<Vec<f32>> {
            rows.iter().enumerate().map(|(j, r)| if visible.contains(&j) { r.clone() } else { vec![f32::NAN; kvd] }).collect()
        };
        let kv = store(&att, &hidden(&keys), &hidden(&values));
        let mut probs = vec![0.0; att.n_head * visible.len()];
        let mut out = vec![0.0; qd];
        att.attend(&q, &kv.view(0, 0), visible.clone(), &mut probs, &mut out);
        for (d, (got, want)) in out.iter().zip(&want).enumerate() {
            prop_assert!(
                (got - want).abs() <= PROP_TOL,
                "value {d} of the query at position {pos}, positions {visible:?} visible of 0..{n_pos}: {got}, the definition gives {want}"
            );
        }
    }
}

#[test]
fn attend_overwrites_whatever_out_held() {
    // `out` is a buffer the caller reuses from token to token: what it held before must not
    // leak into the result.
    let att = small_attention(None);
    let (qd, kvd, n) = (att.q_dim(), att.kv_dim(), 5);
    let value = |i: usize| ((i * 7919) % 113) as f32 / 56.0 - 1.0;
    let q: Vec<f32> = (0..qd).map(value).collect();
    let keys: Vec<Vec<f32>> = (0..n)
        .map(|j| (0..kvd).map(|i| value(i + 100 * j + 7)).collect())
        .collect();
    let values: Vec<Vec<f32>> = (0..n)
        .map(|j| (0..kvd).map(|i| value(i + 100 * j + 31)).collect())
        .collect();
    let kv = store(&att, &keys, &values);
    let mut probs = vec![0.0; att.n_head * n];
    let mut clean = vec![0.0; qd];
    att.attend(&q, &kv.view(0, 0), 0..n, &mut probs, &mut clean);
    for garbage in [1.0, -3.5, f32::NAN] {
        let mut out = vec![garbage; qd];
        att.attend(&q, &kv.view(0, 0), 0..n, &mut probs, &mut out);
        assert_eq!(
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            clean.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "attend into a buffer holding {garbage} gave {out:?}, into zeros {clean:?}"
        );
    }
}
