//! A conversation that keeps its KV cache between turns.
//!
//! Each turn renders the whole conversation with the model's chat template and tokenizes it.
//! Most of those tokens were computed in earlier turns: the cache still holds the keys and
//! values of the previous prompt and answer. [`PrefixSession`] remembers which tokens the cache
//! holds, keeps the longest common prefix with the new sequence, and computes only the rest —
//! the same idea as chapter 7's prefix cache, for one sequence.
//!
//! The prefix is computed on token ids, not on text, because the tokens of the rendered
//! conversation need not be the tokens the model generated: the answer is re-tokenized from its
//! text, and BPE can split the same text differently than the sampler produced it. Where the
//! two differ, the cache is cut there and recomputed from that point, which is always correct.

use ch08::ch04::{ForwardError, GenParams, Generation, Session, generate};
use ch08::{Cached, ChatTemplate, ContiguousCache, Message, Model, Tokenizer};

// ANCHOR: prefix_session
/// A [`Session`] over a contiguous KV cache that knows which tokens the cache holds. Given any
/// sequence, it keeps the longest common prefix of the two and computes only the rest.
pub struct PrefixSession<'m> {
    inner: Cached<'m, ContiguousCache>,
    tokens: Vec<u32>, // the tokens whose keys and values are in the cache, in order
}

impl<'m> PrefixSession<'m> {
    /// An empty session whose cache holds `n_ctx` positions.
    pub fn new(model: &'m Model, n_ctx: usize) -> PrefixSession<'m> {
        PrefixSession {
            inner: Cached::contiguous(model, Some(n_ctx)),
            // Never more than the cache holds: reserved, so that decoding does not reallocate.
            tokens: Vec::with_capacity(n_ctx),
        }
    }

    /// The tokens the cache holds.
    pub fn cached(&self) -> &[u32] {
        &self.tokens
    }

    /// How many leading tokens of `tokens` the cache already holds and would be kept. At least
    /// one token is always computed, since logits come from computing a token.
    pub fn reusable(&self, tokens: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        common.min(tokens.len().saturating_sub(1))
    }
}

impl Session for PrefixSession<'_> {
    fn next_logits(&mut self, tokens: &[u32], _n_new: usize) -> Result<&[f32], ForwardError> {
        let keep = self.reusable(tokens);
        self.inner.kv.truncate(keep);
        self.inner.n_past = keep;
        self.tokens.truncate(keep);
        let result = self
            .inner
            .next_logits(tokens, tokens.len() - keep)
            .map(|_| ());
        // On an error part of the new tokens may be in the cache (prefill runs in chunks);
        // `n_past` says how many.
        self.tokens
            .extend_from_slice(&tokens[keep..self.inner.n_past]);
        result.map(|()| self.inner.logits())
    }
}
// ANCHOR_END: prefix_session

/// What one turn did.
#[derive(Debug, Clone)]
pub struct Turn {
    pub generation: Generation,
    /// Leading prompt tokens whose keys and values were kept from earlier turns.
    pub reused: usize,
}

impl Turn {
    /// Prompt tokens actually computed this turn.
    pub fn computed(&self) -> usize {
        self.generation.prompt_ids.len() - self.reused
    }
}

// ANCHOR: chat
/// A conversation with a model: the messages so far and the session whose cache holds them.
pub struct Chat<'m> {
    pub messages: Vec<Message>,
    pub session: PrefixSession<'m>,
    template: &'m ChatTemplate,
    tokenizer: &'m Tokenizer,
}

impl<'m> Chat<'m> {
    /// A new conversation, opened by a system message if one is given (otherwise the template
    /// may supply its own, as SmolLM2's does).
    pub fn new(
        model: &'m Model,
        tokenizer: &'m Tokenizer,
        template: &'m ChatTemplate,
        system: Option<&str>,
        n_ctx: usize,
    ) -> Chat<'m> {
        Chat {
            messages: system
                .map(|s| vec![Message::new("system", s)])
                .unwrap_or_default(),
            session: PrefixSession::new(model, n_ctx),
            template,
            tokenizer,
        }
    }

    /// The token ids of the conversation so far, ending with the header of an assistant turn.
    pub fn prompt_ids(&self) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
        let text = self.template.render(&self.messages, true)?;
        Ok(self.tokenizer.encode(&text, true, true))
    }

    /// Add `user`'s message, generate the answer (streamed to `on_text`) and keep it.
    pub fn turn(
        &mut self,
        user: &str,
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Turn, Box<dyn std::error::Error>> {
        self.messages.push(Message::new("user", user));
        let ids = match self.prompt_ids() {
            Ok(ids) => ids,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        let reused = self.session.reusable(&ids);
        let generation = match generate(&mut self.session, self.tokenizer, &ids, params, on_text) {
            Ok(g) => g,
            Err(e) => {
                self.messages.pop();
                return Err(e.into());
            }
        };
        self.messages
            .push(Message::new("assistant", &generation.text));
        Ok(Turn { generation, reused })
    }
}
// ANCHOR_END: chat
