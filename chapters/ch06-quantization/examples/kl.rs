//! How far a quantized model's predictions are from a reference model's: the KL divergence of
//! their next-token distributions over a fixed paragraph, as `llama-perplexity --kl-divergence`
//! measures it.
//!
//! cargo run --release -p ch06 --example kl -- REF.gguf TEST.gguf [TEST2.gguf …] [--tokens 128]
//!
//! Both models read the same tokens, with logits at every position. At each position, with P
//! the reference's distribution and Q the test model's, KL(P ‖ Q) = Σ P log(P / Q) is the
//! information lost by predicting with Q when P is right: 0 for identical predictions. It
//! prints the mean and the largest KL over the positions, how often the two agree on the most
//! likely token, and each model's perplexity on the paragraph.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch03::NoObserver;
use ch04::sampling::argmax;
use ch04::{Batch, Model};
use ch06::QuantLoader;
use ch06::agreement::{kl_divergence_of_log_probs, log_softmax};
use clap::Parser;
use std::path::{Path, PathBuf};

/// The text both models read: plain prose, long enough for 256 tokens of this vocabulary.
const TEXT: &str = "The lighthouse keeper had kept a log for thirty-one years, and every entry \
began the same way: the date, the direction of the wind, and the colour of the sea at dawn. \
Most days the sea was grey. Some mornings it turned the green of old bottle glass, and once, \
in a winter nobody on the island forgot, it froze a hundred yards out from the rocks. The log \
recorded ships as well, though fewer every year. In the early pages there were fishing boats \
by the dozen, a mail steamer twice a week and the occasional tall ship blown off course. By \
the last pages there was mostly weather. When the light was finally automated, an engineer \
came from the mainland to install the new lamp, a small box of electronics that needed no \
one to wind it or trim its wick. He asked the keeper what he would do now. The keeper said he \
would go on writing the log, because the sea did not know that anything had changed. The \
engineer laughed, but he wrote down the address of the island, and for years afterwards he \
received a letter every spring: the date, the direction of the wind, and the colour of the sea \
at dawn. Scientists who later studied the letters found that they held one of the longest \
unbroken records of coastal weather in the region, kept by hand with nothing but a barometer, \
a thermometer and a pair of patient eyes.";

#[derive(Parser)]
#[command(about = "KL divergence of quantized models' next-token distributions from a reference")]
struct Args {
    /// The reference model (an F32 file, for instance).
    reference: PathBuf,
    /// The models to compare with it.
    #[arg(required = true)]
    tests: Vec<PathBuf>,
    /// Tokens of the paragraph to read.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Print one JSON object per test model.
    #[arg(long)]
    json: bool,
}

type Error = Box<dyn std::error::Error>;

/// What one model read and predicted.
struct Run {
    ids: Vec<u32>,    // (n): the first n tokens of TEXT
    logits: Vec<f32>, // (n, vocab): the prediction at every position
    vocab: usize,
}

/// Run the model at `path` on the first `n` tokens of `TEXT`.
fn run(path: &Path, n: usize) -> Result<Run, Error> {
    let file = GgufFile::open(path)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let ids = tok.encode(TEXT, true, false);
    if n < 2 || n > ids.len() {
        return Err(format!(
            "--tokens {n}: the paragraph has {} tokens (and at least 2 are needed)",
            ids.len()
        )
        .into());
    }
    let ids = ids[..n].to_vec();
    let model = Model::load(&file, &QuantLoader, &ch04::architectures())?;
    let logits = model.forward(
        &Batch::sequence(0, &ids, 0, true),
        &mut model.new_kv(),
        &mut NoObserver,
    )?;
    let vocab = model.config.vocab_size;
    Ok(Run { ids, logits, vocab })
}

/// How far one model's predictions are from the reference's.
struct Stats {
    mean: f64,
    p99: f64,
    max: f64,
    top1: f64,
    ppl_ref: f64,
    ppl_test: f64,
}

fn compare(reference: &Run, test: &Run) -> Stats {
    let (ids, vocab) = (&reference.ids, reference.vocab);
    let (ref_logits, test_logits) = (&reference.logits, &test.logits);
    let mut kl = vec![];
    let (mut same, mut nll_ref, mut nll_test) = (0, 0.0, 0.0);
    // ANCHOR: kl
    for (t, (r, q)) in ref_logits
        .chunks_exact(vocab)
        .zip(test_logits.chunks_exact(vocab))
        .enumerate()
    {
        // In f64 (`ch06::agreement`, the tests' KL): the probabilities of unlikely tokens are
        // tiny, and KL sums many small differences of their logarithms.
        let (lp, lq) = (log_softmax(r), log_softmax(q));
        kl.push(kl_divergence_of_log_probs(&lp, &lq));
        same += usize::from(argmax(r) == argmax(q));
        if let Some(&next) = ids.get(t + 1) {
            nll_ref -= lp[next as usize];
            nll_test -= lq[next as usize];
        }
    }
    // ANCHOR_END: kl
    let n = kl.len() as f64;
    let mean = kl.iter().sum::<f64>() / n;
    kl.sort_by(f64::total_cmp);
    let p99 = kl[((n * 0.99).ceil() as usize).clamp(1, kl.len()) - 1];
    Stats {
        mean,
        p99,
        max: kl[kl.len() - 1],
        top1: same as f64 / n,
        ppl_ref: (nll_ref / (n - 1.0)).exp(),
        ppl_test: (nll_test / (n - 1.0)).exp(),
    }
}

fn main_() -> Result<(), Error> {
    let args = Args::parse();
    let reference = run(&args.reference, args.tokens)?;
    let ids = &reference.ids;
    for test in &args.tests {
        let tested = run(test, args.tokens)?;
        if tested.ids != reference.ids || tested.vocab != reference.vocab {
            return Err(format!(
                "{} and {} do not share a vocabulary: they tokenize the text differently",
                args.reference.display(),
                test.display()
            )
            .into());
        }
        let s = compare(&reference, &tested);
        if args.json {
            let json = serde_json::json!({
                "reference": args.reference, "test": test, "tokens": ids.len(),
                "mean_kl": s.mean, "p99_kl": s.p99, "max_kl": s.max, "top1": s.top1,
                "ppl_reference": s.ppl_ref, "ppl_test": s.ppl_test,
            });
            println!("{json}");
        } else {
            println!(
                "{}: over {} tokens, KL mean {:.6}, 99th percentile {:.6}, max {:.6}; \
                 same top token {:.1}%; perplexity {:.3} (reference {:.3})",
                test.display(),
                ids.len(),
                s.mean,
                s.p99,
                s.max,
                100.0 * s.top1,
                s.ppl_test,
                s.ppl_ref
            );
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = main_() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
