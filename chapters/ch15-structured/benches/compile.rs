//! How long a grammar takes to compile, against its size: from 1 KiB up to the limit
//! (`MAX_GRAMMAR_BYTES`, 1 MiB), through [`compile`] — what the command line and the server
//! call: parsing, the left-recursion and productivity checks, and the stacks at the start.
//!
//! One group per shape, each a shape that once cost time quadratic in its size: a long
//! `literal` and a long `class` (each character decoded from the rest of the text), a chain of
//! rules each productive only once the next one is (`chain_top_down`, which took one pass over
//! all rules per link, and `chain_bottom_up`), and a JSON `schema` of many properties. Members
//! are sizes in bytes of the text (`1KiB` … `1024KiB`), with that throughput: a compile linear
//! in its text takes the same time per byte at every size. Each text is compiled and checked
//! once before it is timed.
//!
//! ```text
//! cargo bench -p ch15 --bench compile [-- literal]
//! ```

use ch15::gbnf::MAX_GRAMMAR_BYTES;
use ch15::{Source, compile};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use std::hint::black_box;
use std::time::Duration;

/// From a small grammar to the largest accepted, by 16×.
const SIZES: [usize; 4] = [1 << 10, 16 << 10, 256 << 10, MAX_GRAMMAR_BYTES];

/// `head`, then `unit` as many times as fit with `tail` in `size` bytes, then `tail`.
fn fill(head: &str, unit: &str, tail: &str, size: usize) -> String {
    let n = (size - head.len() - tail.len()) / unit.len();
    format!("{head}{}{tail}", unit.repeat(n))
}

/// `root ::= r0`, `rK ::= "x" rK+1`, …, `rN ::= "x"`, in `size` bytes at most; the rules in
/// that order, or the reverse.
fn chain(size: usize, top_down: bool) -> String {
    let head = "root ::= r0\n";
    let mut rules = Vec::new();
    let mut bytes = head.len();
    for k in 0.. {
        let rule = format!("r{k} ::= \"x\" r{}\n", k + 1);
        // Room for this rule and the one that ends the chain after it.
        if bytes + rule.len() + rule.len() > size {
            rules.push(format!("r{k} ::= \"x\"\n"));
            break;
        }
        bytes += rule.len();
        rules.push(rule);
    }
    if !top_down {
        rules.reverse();
    }
    format!("{head}{}", rules.concat())
}

/// An object schema of required integer properties, each with a description (as tools'
/// schemas have), in `size` bytes at most.
fn schema(size: usize) -> String {
    let mut properties = Vec::new();
    let mut required = Vec::new();
    // The object around the lists, and what each property adds to both.
    let mut bytes = 64;
    for k in 0.. {
        let property = format!(
            "\"p{k}\": {{\"type\": \"integer\", \"description\": \"how many of item {k}\"}}"
        );
        let name = format!("\"p{k}\"");
        bytes += property.len() + name.len() + 4;
        if bytes > size {
            break;
        }
        properties.push(property);
        required.push(name);
    }
    format!(
        "{{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [{}]}}",
        properties.join(", "),
        required.join(", ")
    )
}

type Shape = (&'static str, fn(usize) -> Source);

const SHAPES: [Shape; 5] = [
    ("literal", |n| {
        Source::Grammar(fill("root ::= \"", "a", "\"", n))
    }),
    // Characters of one to four bytes, and a range.
    ("class", |n| {
        Source::Grammar(fill("root ::= [", "aé☃😀0-9", "]", n))
    }),
    ("chain_top_down", |n| Source::Grammar(chain(n, true))),
    ("chain_bottom_up", |n| Source::Grammar(chain(n, false))),
    ("schema", |n| Source::JsonSchema(schema(n))),
];

fn compile_sizes(c: &mut Criterion) {
    for (name, make) in SHAPES {
        let mut group = c.benchmark_group(name);
        // A megabyte compiles in tens of milliseconds: ten samples in a second are enough to
        // tell linear from quadratic, and keep the whole bench under a minute.
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for size in SIZES {
            let source = make(size);
            let (Source::Grammar(text) | Source::JsonSchema(text)) = &source;
            assert!(
                text.len() <= size && text.len() > size / 2,
                "{name}: {} bytes for {size}",
                text.len()
            );
            let g = compile(&source).unwrap_or_else(|e| panic!("{name}, {size} bytes: {e}"));
            assert!(!g.elems.is_empty(), "{name}: no rules");
            group.throughput(Throughput::Bytes(text.len() as u64));
            // Linear sampling runs 1 + 2 + … + 10 compiles, more than a second's worth from
            // 256 KiB on; flat sampling runs the same few in each sample.
            group.sampling_mode(if size >= 256 << 10 {
                SamplingMode::Flat
            } else {
                SamplingMode::Linear
            });
            group.bench_with_input(
                BenchmarkId::from_parameter(format!("{}KiB", size >> 10)),
                &source,
                |b, source| b.iter(|| compile(black_box(source))),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, compile_sizes);
criterion_main!(benches);
