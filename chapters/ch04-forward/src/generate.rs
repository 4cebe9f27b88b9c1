//! The generation loop: prompt in, tokens out, text streamed as it is produced.
//!
//! The loop asks a [`Session`] for the logits of the next token, samples one, streams its text
//! and repeats until an end-of-generation token, a stop string or the token limit. The session
//! decides how the logits are computed. This chapter's [`Uncached`] session recomputes the whole
//! sequence for every new token — O(n²) work for n tokens, deliberately: chapter 5 adds a
//! session with a KV cache that computes only the new token, and the loop does not change.

use crate::compute::Scratch;
use crate::model::{Batch, ForwardError, Model, NonFinite};
use crate::sampling::{MakeRule, Sampler, SamplerParams, TokenRule};
use ch02::{StreamDecoder, Tokenizer};
use ch03::{KvError, NoObserver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Computes next-token logits for a growing sequence.
pub trait Session {
    /// Why a step fails: [`ForwardError`] for the sessions of this book's CPU chapters; a
    /// session that computes elsewhere may fail in ways of its own, in an error that can also
    /// hold a `ForwardError`.
    type Error: StepError;

    /// Logits `(vocab)` of the token after `tokens`. The last `n_new` of `tokens` are new since
    /// the previous call (all of them on the first call). The slice lives in the session's own
    /// buffers until the next call, so a decode step allocates nothing.
    fn next_logits(&mut self, tokens: &[u32], n_new: usize) -> Result<&[f32], Self::Error>;
}

/// What the generation loop asks of a failed step: was it the context filling up (then it
/// stops cleanly, as llama.cpp does), or something else (then it fails)?
pub trait StepError: std::error::Error + From<ForwardError> {
    /// The tokens no longer fit: the KV store is full, or a position is beyond the model's
    /// context.
    fn context_full(&self) -> bool;
}

impl StepError for ForwardError {
    fn context_full(&self) -> bool {
        matches!(
            self,
            ForwardError::Kv(KvError::Full { .. }) | ForwardError::PositionOutOfRange { .. }
        )
    }
}

// ANCHOR: uncached
/// No cache: every call runs the model over the whole sequence, throwing the keys and values
/// away afterwards.
pub struct Uncached<'m> {
    pub model: &'m Model,
    scratch: Scratch,
}

impl<'m> Uncached<'m> {
    pub fn new(model: &'m Model) -> Uncached<'m> {
        Uncached {
            model,
            scratch: Scratch::default(),
        }
    }
}

impl Session for Uncached<'_> {
    type Error = ForwardError;

    fn next_logits(&mut self, tokens: &[u32], _n_new: usize) -> Result<&[f32], ForwardError> {
        let mut kv = self.model.new_kv();
        self.model.forward_with(
            &Batch::sequence(0, tokens, 0, false),
            &mut kv,
            &mut NoObserver,
            &mut self.scratch,
        )
    }
}
// ANCHOR_END: uncached

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Generation stops when the text contains one of these; the text ends before it.
    pub stop: Vec<String>,
    /// Which tokens may come next, if not all ([`MakeRule`]): each generation starts its own.
    pub rule: Option<Arc<dyn MakeRule>>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (`<|im_end|>`, `</s>`, …).
    EndOfGeneration,
    StopString,
    MaxTokens,
    /// The context is full: the next token would need a position the KV cache (or the RoPE
    /// table) does not have. llama.cpp stops there too.
    ContextFull,
    /// Ended from outside before any of the above: a server's client went away, or the
    /// request ran out of time.
    Cancelled,
}

impl StopReason {
    /// The name used in `--json` and by the server: `eog`, `stop`, `length`, `context`,
    /// `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndOfGeneration => "eog",
            StopReason::StopString => "stop",
            StopReason::MaxTokens => "length",
            StopReason::ContextFull => "context",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// The result of a generation, with timings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// Generated ids, including a final end-of-generation token if there was one.
    pub ids: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    /// Leading prompt tokens whose keys and values were kept from earlier work (a prefix
    /// cache), not computed.
    pub reused: usize,
    /// Time of the first call, over the prompt.
    pub prefill: Duration,
    /// Time of the later calls, one per generated token fed back.
    pub decode: Duration,
    pub decode_calls: usize,
}

impl Generation {
    /// Prompt tokens computed, not reused.
    pub fn computed(&self) -> usize {
        self.prompt_ids.len() - self.reused
    }
    pub fn prefill_tok_s(&self) -> f64 {
        self.computed() as f64 / self.prefill.as_secs_f64()
    }
    pub fn decode_tok_s(&self) -> f64 {
        if self.decode_calls == 0 {
            0.0
        } else {
            self.decode_calls as f64 / self.decode.as_secs_f64()
        }
    }
}

/// Holds back text that might be the start of a stop string, so a stop string is never
/// streamed even in part.
#[derive(Debug, Clone, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    text: String,
    emitted: usize,
}

impl StopFilter {
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops,
            ..StopFilter::default()
        }
    }

    /// All text so far, ending before a stop string if one was found.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Add text; returns (text safe to emit now, whether a stop string was found).
    pub fn push(&mut self, s: &str) -> (String, bool) {
        self.text.push_str(s);
        if let Some(i) = self
            .stops
            .iter()
            .filter_map(|st| self.text.find(st.as_str()))
            .min()
        {
            self.text.truncate(i);
            let out = self.text[self.emitted.min(i)..].to_string();
            self.emitted = i;
            return (out, true);
        }
        // Longest suffix of the text that is a proper prefix of some stop string.
        let mut hold = 0;
        for st in &self.stops {
            for k in (1..st.len().min(self.text.len() + 1)).rev() {
                if st.is_char_boundary(k) && self.text.ends_with(&st[..k]) {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        let safe = self.text.len() - hold;
        let out = self.text[self.emitted..safe.max(self.emitted)].to_string();
        self.emitted = safe.max(self.emitted);
        (out, false)
    }

    /// Everything still held back (at the end of generation).
    pub fn finish(&mut self) -> String {
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }
}

// ANCHOR: generator
/// One request's side of generation, a step at a time: its own [`Sampler`] (its seed, its random
/// stream), [`StreamDecoder`] and [`StopFilter`], its token limit and what it generated. Fed
/// logits, it samples the next token, decides whether generation ends there, and returns the
/// text that can be streamed. [`generate`] runs one over a [`Session`]; chapter 7's scheduler
/// keeps one per request and feeds it rows of a batch, so both produce the same tokens and
/// text from the same logits.
pub struct Generator<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    rule: Option<Box<dyn TokenRule>>,
    decoder: Option<StreamDecoder<'t>>, // taken when generation ends
    filter: StopFilter,
    max_tokens: usize,
    /// Generated ids so far, a final end-of-generation token included.
    pub ids: Vec<u32>,
    /// Set when generation has ended.
    pub stop: Option<StopReason>,
}

impl<'t> Generator<'t> {
    pub fn new(tokenizer: &'t Tokenizer, params: &GenParams) -> Generator<'t> {
        Generator {
            tokenizer,
            sampler: Sampler::new(params.sampler.clone()),
            rule: params.rule.as_ref().map(|r| r.start(tokenizer)),
            decoder: Some(StreamDecoder::new(tokenizer)),
            filter: StopFilter::new(params.stop.clone()),
            max_tokens: params.max_tokens,
            ids: Vec::new(),
            stop: (params.max_tokens == 0).then_some(StopReason::MaxTokens),
        }
    }
    // ANCHOR_END: generator

    // ANCHOR: generator_sample
    /// Sample the next token from `logits` `(vocab)`, given every token so far (`history`:
    /// prompt and generated, for the repetition penalty). Returns the token and the text to
    /// stream now; when this token ends generation, [`Generator::stop`] is set and the text
    /// includes everything that was held back.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> (u32, String) {
        debug_assert!(self.stop.is_none(), "sampling after generation ended");
        let next = match self.rule.as_deref_mut() {
            None => self.sampler.sample(logits, history),
            Some(rule) => {
                rule.budget(self.max_tokens.saturating_sub(self.ids.len()));
                self.sampler.sample_ruled(logits, history, rule)
            }
        };
        self.ids.push(next);
        let mut text = String::new();
        if self.tokenizer.is_eog(next) {
            self.stop = Some(StopReason::EndOfGeneration);
        } else {
            let piece = self
                .decoder
                .as_mut()
                .map(|d| d.push(next))
                .unwrap_or_default();
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
    // ANCHOR_END: generator_sample

    /// End generation for `reason` (the context is full, say) before the next token; returns
    /// the text still held back.
    pub fn end(&mut self, reason: StopReason) -> String {
        if self.stop.is_some() {
            return String::new();
        }
        self.stop = Some(reason);
        self.finish()
    }

    /// The text still held back once generation ends: bytes of an unfinished character, and
    /// text that turned out not to start a stop string.
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

    /// The text generated so far (all of it once generation has ended), ending before a stop
    /// string.
    pub fn text(&self) -> &str {
        self.filter.text()
    }
}

// ANCHOR: generate
/// Generate from `prompt` (token ids), calling `on_text` with each piece of text as soon as it
/// is complete UTF-8 and cannot be part of a stop string.
pub fn generate<S: Session + ?Sized>(
    session: &mut S,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, S::Error> {
    let mut generator = Generator::new(tok, params);
    let mut tokens = Vec::with_capacity(prompt.len() + params.max_tokens.min(1 << 16));
    tokens.extend_from_slice(prompt);
    let (mut prefill, mut decode, mut decode_calls) = (Duration::ZERO, Duration::ZERO, 0);
    let mut n_new = prompt.len();
    while generator.stop.is_none() {
        let t0 = Instant::now();
        let logits = match session.next_logits(&tokens, n_new) {
            Ok(logits) => logits,
            // The prompt fitted, the next token does not: stop cleanly, as llama.cpp does.
            Err(e) if e.context_full() && !generator.ids.is_empty() => {
                on_text(&generator.end(StopReason::ContextFull));
                break;
            }
            Err(e) => return Err(e),
        };
        NonFinite::check(logits, generator.ids.len(), &tokens)
            .map_err(|e| S::Error::from(e.into()))?;
        if generator.ids.is_empty() {
            prefill = t0.elapsed();
        } else {
            decode += t0.elapsed();
            decode_calls += 1;
        }
        let (next, text) = generator.sample(logits, &tokens);
        on_text(&text);
        tokens.push(next);
        n_new = 1;
    }
    Ok(Generation {
        prompt_ids: prompt.to_vec(),
        text: generator.text().to_string(),
        stop: generator.stop.unwrap_or(StopReason::MaxTokens),
        ids: generator.ids,
        reused: 0,
        prefill,
        decode,
        decode_calls,
    })
}
// ANCHOR_END: generate

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, String) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut streamed = String::new();
        for p in pieces {
            let (out, stopped) = f.push(p);
            streamed += &out;
            if stopped {
                return (streamed, true, f.text);
            }
        }
        streamed += &f.finish();
        (streamed, false, f.text)
    }

    #[test]
    fn stop_string_split_across_pieces_is_never_streamed() {
        let (streamed, stopped, text) = run(&["\nUser:"], &["Hi", " there\n", "Us", "er: more"]);
        assert!(stopped);
        assert_eq!(streamed, "Hi there");
        assert_eq!(text, "Hi there");
    }

    #[test]
    fn held_back_text_is_released_when_it_is_not_a_stop() {
        let (streamed, stopped, _) = run(&["STOP"], &["a S", "T", "x end"]);
        assert!(!stopped);
        assert_eq!(streamed, "a STx end");
    }
}
