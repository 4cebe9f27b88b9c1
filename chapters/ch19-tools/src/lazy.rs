//! A lazy grammar (llama.cpp's `grammar_lazy`): the answer is free until the model writes the
//! trigger — the format's opening marker, `<tool_call>` say — and from there on it is held to
//! the grammar, which begins with the trigger itself. So a model may answer in words, and a
//! call it opens always parses and validates. Chapter 4's [`TokenRule`] is all it takes: the
//! rule watches the text of the tokens it is told were chosen, and hands the mask to chapter
//! 15's [`GrammarRule`] once the trigger is in it.

use ch02::Tokenizer;
use ch04::{MakeRule, TokenRule};
use ch15::Constraint;
use ch15::mask::GrammarRule;

/// What starts the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// This text, anywhere in the answer.
    Word(&'static str),
    /// This text as the answer's first after any whitespace (Llama 3.x's bare JSON call).
    Start(&'static str),
}

/// A grammar that starts at its trigger ([`MakeRule`]).
#[derive(Debug, Clone)]
pub struct LazyGrammar {
    trigger: Trigger,
    constraint: Constraint,
}

impl LazyGrammar {
    /// `constraint`'s grammar must accept text that begins with the trigger.
    pub fn new(trigger: Trigger, constraint: Constraint) -> LazyGrammar {
        LazyGrammar {
            trigger,
            constraint,
        }
    }
}

impl MakeRule for LazyGrammar {
    fn start(&self, tokenizer: &Tokenizer) -> Box<dyn TokenRule> {
        match self.constraint.state(tokenizer) {
            Ok(rule) => Box::new(Lazy {
                trigger: self.trigger,
                rule,
                seen: Vec::new(),
                state: Waiting::Watching,
                left: None,
                eog: tokenizer.vocab().eog.iter().copied().collect(),
            }),
            // Checked when compiled; a start that still fails leaves the answer free.
            Err(_) => Box::new(Free),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Watching,
    /// The trigger came: the grammar holds the answer.
    Held,
    /// The trigger can no longer come (a `Start` trigger after other text).
    Never,
    /// What followed the trigger in its token does not fit the grammar: only the end.
    Stopped,
}

/// One generation's lazy grammar.
pub struct Lazy {
    trigger: Trigger,
    rule: GrammarRule,
    /// The end of the text so far, as long as a trigger that may still be completing.
    seen: Vec<u8>,
    state: Waiting,
    left: Option<usize>,
    /// The end-of-generation tokens: all that may come once [`Waiting::Stopped`].
    eog: Vec<u32>,
}

impl Lazy {
    fn word(&self) -> &'static str {
        match self.trigger {
            Trigger::Word(w) | Trigger::Start(w) => w,
        }
    }

    // ANCHOR: watch
    /// The chosen token wrote `piece`: look for the trigger in the text.
    fn watch(&mut self, piece: &[u8]) {
        // ANCHOR: yours_watch
        self.seen.extend_from_slice(piece);
        let word = self.word().as_bytes();
        if let Trigger::Start(_) = self.trigger {
            let start = self.seen.iter().position(|b| !b.is_ascii_whitespace());
            let Some(start) = start else { return };
            let text = &self.seen[start..];
            let n = text.len().min(word.len());
            if text[..n] != word[..n] {
                self.state = Waiting::Never;
                self.seen.clear();
                return;
            }
            if text.len() < word.len() {
                return;
            }
            let from = start;
            self.take_over(from);
            return;
        }
        match self.seen.windows(word.len()).position(|w| w == word) {
            Some(at) => self.take_over(at),
            None => {
                // Keep only what could still be the start of the trigger.
                let keep = word.len().saturating_sub(1).min(self.seen.len());
                let drop = self.seen.len() - keep;
                self.seen.drain(..drop);
            }
        }
        // ANCHOR_END: yours_watch
    }
    // ANCHOR_END: watch

    /// The trigger begins at `at` in `seen`: the grammar takes the text from there on.
    fn take_over(&mut self, at: usize) {
        let text = self.seen.split_off(at);
        self.seen.clear();
        self.state = if self.rule.accept_text(&text) {
            if let Some(left) = self.left {
                self.rule.budget(left);
            }
            Waiting::Held
        } else {
            Waiting::Stopped
        };
    }
}

impl TokenRule for Lazy {
    fn allows(&mut self, token: u32) -> bool {
        match self.state {
            Waiting::Held => self.rule.allows(token),
            Waiting::Stopped => self.eog.contains(&token),
            Waiting::Watching | Waiting::Never => true,
        }
    }

    fn mask(&mut self, logits: &mut [f32]) {
        match self.state {
            Waiting::Held => self.rule.mask(logits),
            Waiting::Stopped => {
                for (t, l) in logits.iter_mut().enumerate() {
                    if !self.eog.contains(&(t as u32)) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            Waiting::Watching | Waiting::Never => {}
        }
    }

    fn accept(&mut self, token: u32) {
        match self.state {
            Waiting::Held => self.rule.accept(token),
            Waiting::Watching => {
                let piece = self.rule.piece(token).to_vec();
                self.watch(&piece);
            }
            Waiting::Never | Waiting::Stopped => {}
        }
    }

    fn budget(&mut self, tokens_left: usize) {
        self.left = Some(tokens_left);
        if self.state == Waiting::Held {
            self.rule.budget(tokens_left);
        }
    }
}

/// Leaves the answer free.
struct Free;

impl TokenRule for Free {
    fn allows(&mut self, _token: u32) -> bool {
        true
    }
    fn mask(&mut self, _logits: &mut [f32]) {}
    fn accept(&mut self, _token: u32) {}
}
