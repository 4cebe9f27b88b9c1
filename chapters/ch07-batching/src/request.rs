//! A request, what it streams while it runs, and what it reports when it is done.
//!
//! Chapter 4's generation loop samples, detokenizes and checks stop conditions in one loop per
//! prompt. A scheduler runs many prompts in one loop, so that per-request state moves into
//! [`Output`]: the request's own [`Sampler`] (its seed, its random stream), its own
//! [`StreamDecoder`] and its own [`StopFilter`]. Fed the same logits, it produces exactly
//! the tokens and text that `generate` produces for the prompt alone.

use ch06::{GenParams, Sampler, StopFilter, StopReason, StreamDecoder, Tokenizer};
use std::time::Duration;

/// A request's number: requests are numbered in the order they arrive, and that order is the
/// scheduler's priority (lower is older, older goes first).
pub type RequestId = usize;

/// A prompt to complete.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Token limit, sampler settings, stop strings.
    pub params: GenParams,
}

/// A request that is done.
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: RequestId,
    pub prompt_len: usize,
    /// Generated ids, including a final end-of-generation token if there was one.
    pub ids: Vec<u32>,
    /// The generated text, ending before a stop string.
    pub text: String,
    pub stop: StopReason,
    /// Positions whose keys and values came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    /// Tokens this request put through the model, recomputation after preemption included.
    pub computed_tokens: usize,
    /// How often it was preempted (its cache dropped, to be recomputed later).
    pub preemptions: usize,
    /// From submission to the first generated token: waiting, then the prompt.
    pub ttft: Duration,
    /// From submission to the end.
    pub latency: Duration,
}

impl Finished {
    /// Generated tokens per second after the first one: the request's decode speed as its user
    /// sees it, slowed by everything it shares the steps with.
    pub fn decode_tok_s(&self) -> f64 {
        let secs = self.latency.saturating_sub(self.ttft).as_secs_f64();
        if self.ids.len() < 2 || secs == 0.0 {
            return 0.0;
        }
        (self.ids.len() - 1) as f64 / secs
    }
}

// ANCHOR: output
/// Everything a running request keeps besides its keys and values. Preemption drops the keys
/// and values only: the sampler's random stream, the decoder's held-back bytes and the text
/// continue where they were, so a recomputed request writes what it would have written.
pub struct Output<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    decoder: Option<StreamDecoder<'t>>, // taken by `finish`
    filter: StopFilter,
    max_tokens: usize,
    /// Generated ids so far.
    pub ids: Vec<u32>,
    /// Set when the request is done.
    pub stop: Option<StopReason>,
}

impl<'t> Output<'t> {
    pub fn new(tokenizer: &'t Tokenizer, params: &GenParams) -> Output<'t> {
        Output {
            tokenizer,
            sampler: Sampler::new(params.sampler.clone()),
            decoder: Some(StreamDecoder::new(tokenizer)),
            filter: StopFilter::new(params.stop.clone()),
            max_tokens: params.max_tokens,
            ids: Vec::new(),
            stop: (params.max_tokens == 0).then_some(StopReason::MaxTokens),
        }
    }

    /// Sample the next token from `logits`, given every token so far (`history`: prompt and
    /// generated, for the repetition penalty). Returns the token and the text to stream.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> (u32, String) {
        debug_assert!(self.stop.is_none(), "sampling for a finished request");
        let next = self.sampler.sample(logits, history);
        self.ids.push(next);
        let mut text = String::new();
        if self.tokenizer.is_eog(next) {
            self.stop = Some(StopReason::EndOfGeneration);
        } else {
            let piece = self.decoder.as_mut().expect("not finished").push(next);
            let (out, stopped) = self.filter.push(&piece);
            text = out;
            if stopped {
                self.stop = Some(StopReason::StopString);
            } else if self.ids.len() >= self.max_tokens {
                self.stop = Some(StopReason::MaxTokens);
            }
        }
        if self.stop.is_some() {
            text.push_str(&self.finish());
        }
        (next, text)
    }

    /// The text still held back once the request is done: bytes of an unfinished character,
    /// and text that turned out not to start a stop string.
    fn finish(&mut self) -> String {
        let Some(decoder) = self.decoder.take() else {
            return String::new();
        };
        if self.stop == Some(StopReason::StopString) {
            return String::new();
        }
        let (mut out, stopped) = self.filter.push(&decoder.finish());
        if stopped {
            self.stop = Some(StopReason::StopString);
        } else {
            out.push_str(&self.filter.finish());
        }
        out
    }

    /// The text generated so far (all of it once the request is done).
    pub fn text(&self) -> &str {
        self.filter.text()
    }
}
// ANCHOR_END: output
