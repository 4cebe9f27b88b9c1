//! Every GPU kernel against the CPU code of earlier chapters, on sizes that leave tails: rows
//! that are not a multiple of a workgroup's, columns of several blocks and a partial tile,
//! batches of 1, 3 and 17 tokens, attention over more than one tile of keys.
//!
//! The GPU adds floats in another order than the CPU (a tree of 64 partial sums in a
//! workgroup, tiles of 64 columns, f32 where chapter 4 sums squares in f64), and its compiler
//! may fuse a multiply and an add into one rounding. So results agree to a few units in the last
//! place, not bit for bit; each tolerance says why it has its size. A wrong block layout,
//! nibble order, scale or index is off by whole units.
//!
//! Without a GPU adapter (no Vulkan driver) each test says so once on the terminal and returns
//! without checking anything, unless `LLM_RS_REQUIRE_GPU` is set: then a missing adapter fails
//! with the error that lists what wgpu saw. CI installs Mesa's software Vulkan driver
//! (lavapipe) and sets it, so there every test here runs.

mod common;

use ch01::config::RopeStyle;
use ch01::{Config, GgmlType, GgufFile, Value};
use ch03::matrix::{LoadError, matmul};
use ch03::{Attention, AttentionOps, KvStore, RopeTable, Scalar, TokenPos, VecKv};
use ch04::Compute;
use ch04::compute::rms_norm;
use ch06::gguf_write::GgufWriter;
use ch06::quants::type_traits;
use ch09::gpu_llama::GpuLlama;
use ch09::gpu_model::rope_cos_sin;
use ch09::{
    Count, Gpu, GpuArchitecture, GpuBlocks, GpuError, GpuMatrix, GpuModel, GpuOptions, Kernel,
    OpBuilder, Step, View, gpu_architectures,
};
use testkit::{Tolerance, assert_close};

/// Products of up to 768 terms of size ≤ 1 in f32, summed in another order (a tree of partial
/// sums, or tiles of 64 columns, against chapter 3's eight running sums): observed up to 3.1e-5
/// (Q4_K, 768 columns, sums of size ~10). Dequantization itself is exact or one fused rounding
/// away.
const MUL_MAT_TOL: Tolerance = Tolerance::new(1e-4, 1e-5);

/// Dequantized weights: the same operations as chapter 6's `to_float` (observed exact on
/// lavapipe), except that a compiler may fuse `q * d + m` into one rounding: one unit in the
/// last place of weights of size ≤ 2.
const GET_ROWS_TOL: Tolerance = Tolerance::new(5e-7, 1e-6);

/// RMSNorm: the sum of squares in f32 instead of f64 (relative error ~1e-7 for 100 terms),
/// then two multiplications: observed 2.4e-7 relative.
const RMS_NORM_TOL: Tolerance = Tolerance::new(1e-6, 2e-6);

/// RoPE: the same table, and `x0 * c - x1 * s` possibly fused into one rounding: a unit in the
/// last place of values of size ≤ 2 (observed exact on lavapipe).
const ROPE_TOL: Tolerance = Tolerance::new(5e-7, 1e-6);

/// SwiGLU: the GPU's `exp` is allowed a few units in the last place more than the CPU's
/// (Vulkan's precision rules: 3 + 2·|x| ULP): observed 9e-7 relative.
const SWIGLU_TOL: Tolerance = Tolerance::new(1e-6, 1e-5);

/// Attention: dot products of up to 96 terms, an online softmax whose maximum and sum are
/// taken in tiles (and in f32, where chapter 3 sums in f64), and weighted sums of up to 88
/// values: outputs of size ≤ 1 observed within 1.8e-7.
const ATTENTION_TOL: Tolerance = Tolerance::new(2e-6, 1e-5);

/// [`assert_close`], printing the largest differences seen (run with `--nocapture`).
fn check(what: &str, shape: &[usize], got: &[f32], want: &[f32], tol: Tolerance) -> f32 {
    let r = assert_close(what, shape, got, want, tol);
    eprintln!(
        "{what}: max |Δ| {:.2e}, max rel {:.2e}",
        r.max_abs, r.max_rel
    );
    r.max_abs
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `rows` rows of `cols` random weights in type `ty` (the file's bytes), and their values as
/// chapter 6 dequantizes them.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let t = type_traits(ty).unwrap();
    let row_bytes = cols / t.block_size * t.type_size;
    let f = values(rows * cols, seed);
    let mut bytes = vec![0u8; rows * row_bytes];
    for (src, dst) in f.chunks_exact(cols).zip(bytes.chunks_exact_mut(row_bytes)) {
        (t.from_float)(src, dst);
    }
    let mut deq = vec![0.0f32; rows * cols]; // (rows, cols)
    for (src, dst) in bytes
        .chunks_exact(row_bytes)
        .zip(deq.chunks_exact_mut(cols))
    {
        (t.to_float)(src, dst);
    }
    (bytes, deq)
}

fn step(n: usize, start_pos: usize) -> Step {
    Step {
        n_tokens: n as u32,
        start_pos: start_pos as u32,
        n_out: n as u32,
        out_row0: 0,
    }
}

fn out_buffer(gpu: &Gpu, floats: usize) -> View {
    gpu.zeros("out", (floats * 4) as u64).unwrap()
}

const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
];

/// Columns for `ty`: three blocks (a partial tile of 64 columns at the end), or three
/// super-blocks for Q4_K; 40 for the plain floats (five groups of eight).
fn cols_for(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K => 768,
        GgmlType::F32 | GgmlType::F16 => 40,
        _ => 96,
    }
}

#[test]
fn mul_mat_matches_the_cpu_for_every_type_kernel_and_batch() {
    let Some(gpu) = common::gpu() else { return };
    let rows = 37; // not a multiple of the 32-row tile, nor of anything else
    let mut worst = 0.0f32;
    for ty in TYPES {
        let cols = cols_for(ty);
        let (bytes, deq) = weights(ty, rows, cols, ty as u64);
        let w = GpuMatrix::upload(&gpu, "w", ty, rows, cols, &bytes).unwrap();
        for n in [1, 3, 17] {
            let x = values(n * cols, 7 + n as u64); // (n, cols)
            let mut want = vec![0.0f32; n * rows]; // (n, rows)
            matmul(&deq, rows, cols, &x, &mut want);
            let xg = gpu.upload_f32("x", &x).unwrap();
            for kernel in [Kernel::MulMatVec, Kernel::MulMat] {
                let y = out_buffer(&gpu, n * rows);
                let b = OpBuilder::new(&gpu);
                let op = b.mul_mat(&w, &xg, &y, Count::Tokens, Some(kernel)).unwrap();
                b.run(&[op], &step(n, 0));
                let got = gpu.read_f32(&y).unwrap();
                let what = format!("{kernel:?} {}: {rows}x{cols}, {n} tokens", ty.name());
                worst = worst.max(check(&what, &[n, rows], &got, &want, MUL_MAT_TOL));
            }
        }
    }
    eprintln!("mul_mat: worst |Δ| {worst:.2e}");
}

#[test]
fn the_output_rows_of_a_product_follow_n_out() {
    // A product over `Count::Out` rows runs on the step's n_out, not on its tokens.
    let Some(gpu) = common::gpu() else { return };
    let (rows, cols, ty) = (37, 96, GgmlType::Q8_0);
    let (bytes, deq) = weights(ty, rows, cols, 3);
    let w = GpuMatrix::upload(&gpu, "w", ty, rows, cols, &bytes).unwrap();
    let x = values(2 * cols, 4);
    let xg = gpu.upload_f32("x", &x).unwrap();
    let y = out_buffer(&gpu, 2 * rows);
    let b = OpBuilder::new(&gpu);
    let op = b.mul_mat(&w, &xg, &y, Count::Out, None).unwrap();
    let s = Step {
        n_tokens: 9,
        start_pos: 0,
        n_out: 2,
        out_row0: 7,
    };
    b.run(&[op], &s);
    let mut want = vec![0.0f32; 2 * rows];
    matmul(&deq, rows, cols, &x, &mut want);
    let got = gpu.read_f32(&y).unwrap();
    check("mul_mat over n_out", &[2, rows], &got, &want, MUL_MAT_TOL);
}

#[test]
fn get_rows_dequantizes_as_chapter_6_does() {
    let Some(gpu) = common::gpu() else { return };
    let rows = 37;
    for ty in TYPES {
        let cols = cols_for(ty);
        let (bytes, deq) = weights(ty, rows, cols, 11 + ty as u64);
        let w = GpuMatrix::upload(&gpu, "w", ty, rows, cols, &bytes).unwrap();
        // Odd rows (Q4_0's and Q8_0's rows start off a word boundary), a repeat, the last.
        let ids: Vec<u32> = vec![0, 5, 36, 5, 17, 1, 30];
        let idg = gpu.upload("ids", bytemuck::cast_slice(&ids)).unwrap();
        let out = out_buffer(&gpu, ids.len() * cols);
        let b = OpBuilder::new(&gpu);
        let op = b.get_rows(&w, &idg, &out).unwrap();
        b.run(&[op], &step(ids.len(), 0));
        let got = gpu.read_f32(&out).unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&r| deq[r as usize * cols..][..cols].iter().copied())
            .collect();
        check(
            &format!("get_rows {}", ty.name()),
            &[ids.len(), cols],
            &got,
            &want,
            GET_ROWS_TOL,
        );
    }
}

#[test]
fn rms_norm_matches_chapter_4() {
    let Some(gpu) = common::gpu() else { return };
    let d = 100; // not a multiple of the 64 threads
    let weight = values(d, 1);
    let wg = gpu.upload_f32("weight", &weight).unwrap();
    for n in [1, 3, 17] {
        let x: Vec<f32> = values(n * d, n as u64).iter().map(|v| v * 30.0).collect();
        let mut want = vec![0.0f32; n * d];
        rms_norm(&x, &weight, 1e-5, &mut want);
        let xg = gpu.upload_f32("x", &x).unwrap();
        let out = out_buffer(&gpu, n * d);
        let b = OpBuilder::new(&gpu);
        let op = b.rms_norm(&xg, &wg, &out, d, 1e-5, Count::Tokens).unwrap();
        b.run(&[op], &step(n, 0));
        let got = gpu.read_f32(&out).unwrap();
        check(
            &format!("rms_norm, {n} rows"),
            &[n, d],
            &got,
            &want,
            RMS_NORM_TOL,
        );

        // The output's rows: only the last, read from row n - 1.
        let out1 = out_buffer(&gpu, d);
        let op = b.rms_norm(&xg, &wg, &out1, d, 1e-5, Count::Out).unwrap();
        let s = Step {
            n_out: 1,
            out_row0: n as u32 - 1,
            ..step(n, 0)
        };
        b.run(&[op], &s);
        let got = gpu.read_f32(&out1).unwrap();
        check(
            "rms_norm, last row",
            &[1, d],
            &got,
            &want[(n - 1) * d..],
            RMS_NORM_TOL,
        );
    }
}

#[test]
fn rope_matches_chapter_3_in_both_styles() {
    let Some(gpu) = common::gpu() else { return };
    let (n_heads, head_dim) = (3, 48);
    for (style, n_rot) in [
        (RopeStyle::Normal, 48),
        (RopeStyle::Neox, 48),
        (RopeStyle::Normal, 32), // a partial rotation: 16 dims pass through
    ] {
        let table = RopeTable::new(n_rot, 10000.0, 1.0, style, 64);
        let cs = gpu
            .upload_f32("rope", &rope_cos_sin(&table, head_dim, n_rot, style))
            .unwrap();
        for (n, start) in [(1, 40), (3, 0), (17, 21)] {
            let x = values(n * n_heads * head_dim, n as u64 + 100);
            let mut want = x.clone();
            for (t, row) in want.chunks_exact_mut(n_heads * head_dim).enumerate() {
                table.apply(row, head_dim, start + t);
            }
            let xg = gpu.upload_f32("x", &x).unwrap();
            let b = OpBuilder::new(&gpu);
            let neox = style == RopeStyle::Neox;
            let op = b.rope(&xg, &cs, n_heads, head_dim, n_rot, neox).unwrap();
            b.run(&[op], &step(n, start));
            let got = gpu.read_f32(&xg).unwrap();
            let what = format!("rope {style:?} n_rot {n_rot}, {n} tokens from {start}");
            check(&what, &[n, n_heads, head_dim], &got, &want, ROPE_TOL);
        }
    }
}

#[test]
fn swiglu_and_add_match_chapter_4() {
    let Some(gpu) = common::gpu() else { return };
    let width = 97;
    for n in [1, 3, 17] {
        let gate: Vec<f32> = values(n * width, 5).iter().map(|v| v * 12.0).collect();
        let up = values(n * width, 6);
        let (gg, ug) = (
            gpu.upload_f32("gate", &gate).unwrap(),
            gpu.upload_f32("up", &up).unwrap(),
        );
        let b = OpBuilder::new(&gpu);
        let ops = [
            b.swiglu(&gg, &ug, width).unwrap(),
            // Then up += gate: the residual add, on the result.
            b.add(&ug, &gg, width).unwrap(),
        ];
        b.run(&ops, &step(n, 0));
        let mut want_gate = gate.clone();
        Scalar.glu(ch04::Activation::Silu, &mut want_gate, &up);
        let mut want_up = up.clone();
        Scalar.add(&mut want_up, &want_gate);
        let got_gate = gpu.read_f32(&gg).unwrap();
        let got_up = gpu.read_f32(&ug).unwrap();
        check("swiglu", &[n, width], &got_gate, &want_gate, SWIGLU_TOL);
        // The add itself is exact; its input carries swiglu's difference.
        check("add", &[n, width], &got_up, &want_up, SWIGLU_TOL);
    }
}

/// Keys and values of positions `0..n_pos`, `(n_pos, n_head_kv * head_dim)` each.
fn kv_values(n_pos: usize, kv_dim: usize) -> (Vec<f32>, Vec<f32>) {
    (values(n_pos * kv_dim, 21), values(n_pos * kv_dim, 22))
}

#[test]
fn attention_matches_chapter_3_with_grouped_heads_and_a_window() {
    let Some(gpu) = common::gpu() else { return };
    // (n_head, n_head_kv, head_dim, window): SmolLM2's grouping of 3 query heads per KV head
    // with an odd head size; 96 dims (two per thread); a sliding window.
    for (n_head, n_head_kv, head_dim, window) in
        [(6, 2, 40, None), (4, 4, 96, None), (6, 3, 64, Some(5))]
    {
        let attn = Attention {
            n_head,
            n_head_kv,
            head_dim,
            rope: RopeTable::new(head_dim, 10000.0, 1.0, RopeStyle::Normal, 1),
            window,
            kq_scale: Attention::standard_scale(head_dim),
        };
        let kv_dim = attn.kv_dim();
        // Queries at positions 70.. see more than one tile of 64 keys.
        for (n, start) in [(1, 70), (3, 0), (17, 70)] {
            let n_ctx = start + n + 5;
            let (k, v) = kv_values(start + n, kv_dim);
            let q = values(n * attn.q_dim(), 31 + n as u64); // (n, n_head, head_dim)
            let mut store = VecKv::new(1, kv_dim);
            store.reserve(0, 0..start + n).unwrap();
            for pos in 0..start + n {
                let r = pos * kv_dim..(pos + 1) * kv_dim;
                store.store(0, 0, pos, &k[r.clone()], &v[r]);
            }
            let mut want = vec![0.0f32; n * attn.q_dim()];
            let tokens = TokenPos::run(0, start, n);
            Scalar.attend(&attn, &q, &tokens, &store.view(0, 0), &mut want);

            // On the GPU: the batch's own keys and values go in through set_rows.
            let kc = gpu.zeros("k_cache", (n_ctx * kv_dim * 4) as u64).unwrap();
            let vc = gpu.zeros("v_cache", (n_ctx * kv_dim * 4) as u64).unwrap();
            let (k_old, v_old) = (&k[..start * kv_dim], &v[..start * kv_dim]);
            if start > 0 {
                gpu.queue
                    .write_buffer(&kc.buffer, 0, bytemuck::cast_slice(k_old));
                gpu.queue
                    .write_buffer(&vc.buffer, 0, bytemuck::cast_slice(v_old));
            }
            let kn = gpu.upload_f32("k", &k[start * kv_dim..]).unwrap();
            let vn = gpu.upload_f32("v", &v[start * kv_dim..]).unwrap();
            let qg = gpu.upload_f32("q", &q).unwrap();
            let out = out_buffer(&gpu, n * attn.q_dim());
            let b = OpBuilder::new(&gpu);
            let ops = [
                b.set_rows(&kn, &vn, &kc, &vc, kv_dim).unwrap(),
                b.attention(
                    &qg,
                    &kc,
                    &vc,
                    &out,
                    n_head,
                    n_head_kv,
                    head_dim,
                    window,
                    attn.kq_scale,
                )
                .unwrap(),
            ];
            b.run(&ops, &step(n, start));
            let got = gpu.read_f32(&out).unwrap();
            let what = format!(
                "attention {n_head}/{n_head_kv} heads of {head_dim}, window {window:?}, \
                 {n} tokens from {start}"
            );
            check(&what, &[n, n_head, head_dim], &got, &want, ATTENTION_TOL);
            // set_rows stored the new rows after the old ones.
            let kc_got = gpu.read_f32(&kc).unwrap();
            check(
                "set_rows",
                &[start + n, kv_dim],
                &kc_got[..(start + n) * kv_dim],
                &k,
                Tolerance::EXACT,
            );
        }
    }
}

#[test]
fn a_type_without_a_kernel_is_an_error_naming_the_tensor() {
    let Some(gpu) = common::gpu() else { return };
    let (bytes, _) = weights(GgmlType::Q6_K, 2, 256, 1);
    let e = GpuMatrix::upload(
        &gpu,
        "blk.0.ffn_down.weight",
        GgmlType::Q6_K,
        2,
        256,
        &bytes,
    )
    .err()
    .expect("Q6_K has no GPU kernel");
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.ffn_down.weight") && msg.contains("Q6_K") && msg.contains("Q4_K"),
        "{msg}"
    );
    // Rows that are not whole blocks.
    let e = GpuMatrix::upload(&gpu, "w", GgmlType::Q4_0, 1, 40, &[0; 18]).err();
    assert!(e.unwrap().to_string().contains("not whole blocks"));
}

#[test]
fn no_adapter_is_a_clear_error() {
    let none = GpuError::NoAdapter { seen: vec![] }.to_string();
    assert!(none.contains("mesa-vulkan-drivers"), "{none}");
    let seen = GpuError::NoAdapter {
        seen: vec!["\"Some GPU\" (Gl, IntegratedGpu)".into()],
    }
    .to_string();
    assert!(seen.contains("adapters seen: \"Some GPU\""), "{seen}");
}

/// The default model cut to its first layer, relabelled as architecture `arch` (its
/// metadata keys renamed to match), with an F32 vector `(d_model)` added for each of `extra`.
fn one_layer_file(arch: &str, extra: &[&str]) -> GgufFile<Vec<u8>> {
    let src = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &src.gguf.metadata {
        let key = match k.strip_prefix("llama.") {
            Some(rest) => format!("{arch}.{rest}"),
            None => k.clone(),
        };
        w.set(&key, v.clone()).unwrap();
    }
    w.set("general.architecture", Value::String(arch.into()))
        .unwrap();
    w.set(&format!("{arch}.block_count"), Value::U32(1))
        .unwrap();
    let layer0 = |n: &str| !n.starts_with("blk.") || n.starts_with("blk.0.");
    for t in src.gguf.tensors.iter().filter(|t| layer0(&t.name)) {
        w.add_tensor(&t.name, &t.dims, t.ggml_type).unwrap();
    }
    let d = src.gguf.tensor("blk.0.attn_q.weight").unwrap().dims[1];
    for name in extra {
        w.add_tensor(name, &[d], GgmlType::F32).unwrap();
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |t| match src.tensor_bytes(&t.name) {
        Ok(b) => Ok::<_, String>(b.to_vec()),
        Err(_) => Ok(vec![0; t.n_bytes() as usize]),
    })
    .unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

/// Room for a few tokens: the tests below only load.
const SMALL: GpuOptions = GpuOptions {
    n_ctx: Some(64),
    max_batch: 8,
};

/// A llama file with biases (which the GPU pass does not run) is refused before anything is
/// uploaded, naming the tensor: running without them would compute another model.
#[test]
fn a_file_with_biases_is_refused_naming_the_tensor() {
    let file = one_layer_file("llama", &["blk.0.attn_q.bias"]);
    let Some(gpu) = common::gpu() else { return };
    let err = GpuModel::load(gpu, &file, &gpu_architectures(), SMALL)
        .err()
        .expect("loaded")
        .to_string();
    assert!(err.contains("blk.0.attn_q.bias"), "{err}");
}

/// A file of an architecture the GPU set does not have is refused by name, with the set
/// listed — even one whose tensors llama's blocks could read, as here: which blocks run is
/// the set's choice, not a guess from the tensors.
#[test]
fn an_architecture_without_gpu_blocks_is_refused_by_name() {
    let file = one_layer_file("qwen2", &[]);
    let Some(gpu) = common::gpu() else { return };
    let err = GpuModel::load(gpu, &file, &gpu_architectures(), SMALL)
        .err()
        .expect("a qwen2 file loaded on llama's GPU blocks")
        .to_string();
    assert!(
        err.contains("architecture \"qwen2\" is not supported (supported: llama)"),
        "{err}"
    );
}

/// Qwen2 without its biases as llama's GPU blocks rotating halves (chapter 13's reading of
/// it on the CPU).
fn load_qwen2_on_llama(
    gpu: &Gpu,
    file: &GgufFile<&[u8]>,
) -> Result<(Config, Box<dyn GpuBlocks>), GpuError> {
    let mut config =
        Config::from_gguf(&file.gguf, &["qwen2"]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    let blocks = GpuLlama::load(gpu, file, &config)?;
    Ok((config, Box::new(blocks)))
}

/// The seam is the set: the same file loads once its architecture is added as a value, with
/// the configuration its loader made, and the model unchanged.
#[test]
fn an_architecture_added_to_the_set_loads() {
    let file = one_layer_file("qwen2", &[]);
    let archs = gpu_architectures().with(GpuArchitecture {
        name: "qwen2",
        load: load_qwen2_on_llama,
    });
    assert_eq!(archs.names(), ["llama", "qwen2"]);
    let Some(gpu) = common::gpu() else { return };
    let model = GpuModel::load(gpu, &file, &archs, SMALL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(model.config.arch, "qwen2");
    assert_eq!(model.config.rope_style, RopeStyle::Neox);
    assert_eq!(model.config.n_layer, 1);
}
