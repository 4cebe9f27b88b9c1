//! Properties of softmax, RoPE and attention that hold for any input.

use ch03::attention::{Attention, AttentionWeights, AttnBias, TokenPos};
use ch03::{DenseMatrix, KvStore, NoObserver, Recorder, RopeStyle, RopeTable, VecKv, softmax};
use proptest::prelude::*;

/// f32 sums of a few hundred terms: relative rounding error stays far below this.
const PROP_TOL: f32 = 1e-4;

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
