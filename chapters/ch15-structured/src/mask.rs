//! From a grammar's state to the tokens that may come next, fast enough to run every step.
//!
//! A token may come next when its bytes can continue some sentence of the grammar. Asking that
//! of one token is a handful of [`Grammar::accept_char`] calls; asking it of a whole
//! vocabulary (49k–262k tokens) one token at a time costs milliseconds. Two things make the
//! mask cheap:
//!
//! - **A token trie** ([`TokenIndex`]): the vocabulary's pieces sorted into a tree of shared
//!   prefixes, laid out in pre-order so that a walk is a loop over an array. The grammar
//!   state of a node is computed once for all tokens below it, and a node whose bytes the
//!   grammar refuses is skipped with its whole subtree — under a JSON grammar after `{`, one
//!   refused byte rules out most of the vocabulary at once.
//! - **A cache of masks by state** ([`MaskCache`]): a grammar returns to the same stacks
//!   again and again (inside every string, after every comma), and the mask depends on
//!   nothing else.
//!
//! And [`Sampler::sample_ruled`](ch04::Sampler::sample_ruled) asks about the sampled token
//! first, so most steps need no mask at all.

use crate::budget::{MAX_BUDGET_TRIES, Shortest};
use crate::gbnf::Grammar;
use crate::matcher::{MatchError, Partial, Scratch, Stacks, feed};
use ch02::Tokenizer;
use ch04::{MakeRule, TokenRule};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The memory one grammar's mask cache may hold, in bytes: 680 masks of the default model's
/// 49,152 tokens (6 KB each), 128 of a 262k vocabulary. A JSON schema of a dozen fields needs
/// a few dozen (the mask-cost example: 8 in a 160-token answer); when the cache is full it
/// starts again. A server keeps at most `formats::MAX_COMPILED` grammars: 64 MiB of masks.
pub const MASK_CACHE_BYTES: usize = 4 << 20;

// ANCHOR: trie
/// The most work one mask may take, in [`Scratch::work`] units (a stack advanced, times its
/// depth and the stacks it is compared with): about 0.7 s on this book's machine, some 60
/// times the dearest mask of a JSON schema on a 262k vocabulary. A grammar whose readings
/// multiply could otherwise make one mask walk the whole trie through thousands of stacks at
/// every node, for minutes. A mask that runs out allows no token, so generation ends there.
pub const MAX_MASK_WORK: u64 = 2_000_000_000;

/// One node of the trie: the byte that leads to it, its depth, where its subtree ends, and
/// the tokens whose piece ends here.
#[derive(Debug, Clone, Copy)]
struct Node {
    byte: u8,
    depth: u32,
    /// Index one past the last node of this node's subtree.
    end: u32,
    tokens: (u32, u32),
}

/// A vocabulary's pieces as a trie in pre-order, with what a grammar needs to know of each
/// token: its bytes, and whether it ends generation.
#[derive(Debug)]
pub struct TokenIndex {
    nodes: Vec<Node>,
    node_tokens: Vec<u32>,
    pieces: Vec<Vec<u8>>,
    eog: Vec<u32>,
    depth: usize,
}
// ANCHOR_END: trie

// ANCHOR: trie_new
impl TokenIndex {
    /// The trie of `tokenizer`'s pieces (special tokens rendered as their text, as llama.cpp's
    /// grammar sees them). End-of-generation tokens and empty pieces are not in the trie: the
    /// first are allowed when the grammar is complete, the second never (llama.cpp's rules).
    /// Nor are pieces that start with NUL, which llama.cpp reads as empty (its pieces are
    /// 0-terminated strings); a grammar that needs NUL is refused when compiled instead.
    pub fn new(tokenizer: &Tokenizer) -> TokenIndex {
        let n = tokenizer.vocab_size();
        let pieces: Vec<Vec<u8>> = (0..n as u32).map(|t| tokenizer.token_to_piece(t)).collect();
        let eog: Vec<u32> = tokenizer.vocab().eog.iter().copied().collect();
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&t| {
                let p = &pieces[t as usize];
                !tokenizer.is_eog(t) && !p.is_empty() && p[0] != 0
            })
            .collect();
        order.sort_by(|&a, &b| pieces[a as usize].cmp(&pieces[b as usize]));
        let root = Node {
            byte: 0,
            depth: 0,
            end: 0,
            tokens: (0, 0),
        };
        let mut nodes = vec![root];
        let mut node_tokens = Vec::with_capacity(order.len());
        let mut path: Vec<usize> = vec![0]; // path[d]: the node at depth d of the last piece
        let mut prev: &[u8] = &[];
        let mut depth = 0;
        // ANCHOR_END: trie_new
        // ANCHOR: trie_build
        for &t in &order {
            let piece = &pieces[t as usize][..];
            let common = piece.iter().zip(prev).take_while(|(a, b)| a == b).count();
            while path.len() > common + 1 {
                let done = path.pop().unwrap_or(0);
                nodes[done].end = nodes.len() as u32;
            }
            for (d, &b) in piece.iter().enumerate().skip(common) {
                path.push(nodes.len());
                nodes.push(Node {
                    byte: b,
                    depth: d as u32 + 1,
                    end: 0,
                    tokens: (0, 0),
                });
            }
            let last = *path.last().unwrap_or(&0);
            if nodes[last].tokens.1 == 0 {
                nodes[last].tokens = (node_tokens.len() as u32, node_tokens.len() as u32);
            }
            node_tokens.push(t);
            nodes[last].tokens.1 = node_tokens.len() as u32;
            depth = depth.max(piece.len());
            prev = piece;
        }
        while let Some(done) = path.pop() {
            nodes[done].end = nodes.len() as u32;
        }
        TokenIndex {
            nodes,
            node_tokens,
            pieces,
            eog,
            depth,
        }
    }
    // ANCHOR_END: trie_build

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    /// Nodes of the trie, its root included.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    fn is_eog(&self, t: u32) -> bool {
        self.eog.contains(&t)
    }

    /// The tokens (not ending generation) whose bytes can come next after `stacks` and
    /// `partial`, as a bit set over the vocabulary: a walk of the trie that skips every
    /// subtree the grammar refuses.
    ///
    /// Most nodes repeat a step already taken: inside a JSON string every ordinary character
    /// leads from the string's state back to the same state. So the walk gives each distinct
    /// set of stacks a number and remembers each step (a state and a character) it computed;
    /// a step taken again is one hash lookup instead of advancing stacks.
    pub fn allowed(&self, g: &Grammar, stacks: &Stacks, partial: Partial) -> Vec<u64> {
        const DEAD: u32 = u32::MAX;
        let mut bits = vec![0u64; self.n_vocab().div_ceil(64)];
        let mut states: Vec<Stacks> = vec![stacks.clone()];
        let mut numbers: FxHashMap<Stacks, u32> = FxHashMap::default();
        numbers.insert(stacks.clone(), 0);
        let mut steps: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        // state[d]: the stacks in force after the node at depth d (a byte inside a character
        // leaves them as they were); partials[d]: the character left unfinished there.
        let mut state = vec![0u32; self.depth + 1];
        let mut partials = vec![Partial::default(); self.depth + 1];
        partials[0] = partial;
        let mut s = Scratch::default();
        let mut next = Stacks::default();
        let mut i = 1;
        while i < self.nodes.len() {
            let node = self.nodes[i];
            let d = node.depth as usize;
            let mut p = partials[d - 1];
            let alive = match p.push(node.byte) {
                Some(c) => {
                    let from = state[d - 1];
                    let to = match steps.get(&(from, c)) {
                        Some(&to) => to,
                        None => {
                            let ok = g.accept_char(&states[from as usize], c, &mut next, &mut s);
                            let to = if ok.is_err() || next.is_empty() {
                                DEAD
                            } else if let Some(&n) = numbers.get(&next) {
                                n
                            } else {
                                let n = states.len() as u32;
                                numbers.insert(next.clone(), n);
                                states.push(next.clone());
                                n
                            };
                            steps.insert((from, c), to);
                            to
                        }
                    };
                    state[d] = to;
                    partials[d] = Partial::default();
                    to != DEAD
                }
                None if p.n_remain < 0 => false,
                None => {
                    state[d] = state[d - 1];
                    partials[d] = p;
                    g.partial_fits(&states[state[d] as usize], p)
                }
            };
            if s.work > MAX_MASK_WORK {
                bits.fill(0);
                break;
            }
            if !alive {
                i = node.end as usize;
                continue;
            }
            for &t in &self.node_tokens[node.tokens.0 as usize..node.tokens.1 as usize] {
                bits[t as usize / 64] |= 1 << (t % 64);
            }
            i += 1;
        }
        bits
    }
}

// ANCHOR: mask_cache
/// Allowed-token bit sets by grammar state.
type Masks = HashMap<(Stacks, Partial), Arc<Vec<u64>>>;

/// Masks already computed for a grammar, by state (its stacks and unfinished character).
#[derive(Debug, Default)]
pub struct MaskCache {
    masks: Mutex<Masks>,
}

impl MaskCache {
    fn get_or_compute(
        &self,
        index: &TokenIndex,
        g: &Grammar,
        stacks: &Stacks,
        partial: Partial,
    ) -> Arc<Vec<u64>> {
        let key = (stacks.clone(), partial);
        if let Some(m) = self.lock().get(&key) {
            return m.clone();
        }
        let mask = Arc::new(index.allowed(g, stacks, partial));
        let mut masks = self.lock();
        let capacity = MASK_CACHE_BYTES / (mask.len() * 8).max(1);
        if masks.len() >= capacity {
            masks.clear();
        }
        masks.insert(key, mask.clone());
        mask
    }
    // ANCHOR_END: mask_cache

    fn lock(&self) -> std::sync::MutexGuard<'_, Masks> {
        // A panic elsewhere while holding the lock leaves a valid map (inserts are whole).
        self.masks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ANCHOR: constraint
/// A compiled grammar as a sampler rule ([`MakeRule`]): every generation gets its own
/// [`GrammarRule`] state; all of them share the grammar, the vocabulary's trie and the
/// masks computed so far.
#[derive(Debug, Clone)]
pub struct Constraint {
    pub grammar: Arc<Grammar>,
    index: Arc<IndexCell>,
    cache: Arc<MaskCache>,
    /// The fewest bytes that finish the grammar from each position, for answers that close
    /// within their token budget (`None`: too large a grammar to measure).
    shortest: Option<Arc<Shortest>>,
}

/// The tries of the vocabularies generations started with, kept for the next ones: each built
/// once per process (a server shares one cell among all its grammars, and its models).
#[derive(Debug, Default)]
pub struct IndexCell(Mutex<Vec<(u64, Arc<TokenIndex>)>>);

/// Vocabularies an [`IndexCell`] keeps tries of: a server with a second model (A/B) needs two.
pub const MAX_VOCABULARIES: usize = 4;

impl IndexCell {
    /// The trie of `tokenizer`'s vocabulary, built the first time it is asked for.
    pub fn get(&self, tokenizer: &Tokenizer) -> Arc<TokenIndex> {
        let key = fingerprint(tokenizer);
        let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, i)) = cell.iter().find(|(k, _)| *k == key) {
            return i.clone();
        }
        let i = Arc::new(TokenIndex::new(tokenizer));
        if cell.len() >= MAX_VOCABULARIES {
            cell.remove(0);
        }
        cell.push((key, i.clone()));
        i
    }
}

/// Tells vocabularies apart without reading all of them: the size, the end-of-generation
/// tokens, and 256 pieces spread over the ids. Two different vocabularies of one size differ
/// almost everywhere; hashing every piece would cost milliseconds per request.
fn fingerprint(tokenizer: &Tokenizer) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    let n = tokenizer.vocab_size();
    n.hash(&mut h);
    for k in 0..256 {
        let id = (k * n / 256) as u32;
        tokenizer.token_to_piece(id).hash(&mut h);
        tokenizer.is_eog(id).hash(&mut h);
    }
    tokenizer.eos().hash(&mut h);
    h.finish()
}
// ANCHOR_END: constraint

// ANCHOR: constraint_state
impl Constraint {
    /// A rule for `grammar`; the trie of the vocabulary is built when a generation starts.
    pub fn new(grammar: Grammar) -> Constraint {
        Constraint::sharing(grammar, Arc::default())
    }

    /// A rule for `grammar` whose trie comes from `index`, shared with other rules.
    pub fn sharing(grammar: Grammar, index: Arc<IndexCell>) -> Constraint {
        Constraint {
            shortest: Shortest::new(&grammar).map(Arc::new),
            grammar: Arc::new(grammar),
            index,
            cache: Arc::default(),
        }
    }

    /// The masks computed so far.
    pub fn cached_masks(&self) -> usize {
        self.cache.len()
    }

    /// A generation's rule state, or why the grammar cannot start (it is too ambiguous).
    pub fn state(&self, tokenizer: &Tokenizer) -> Result<GrammarRule, MatchError> {
        let index = self.index.get(tokenizer);
        let mut scratch = Scratch::default();
        let stacks = self.grammar.initial_stacks(&mut scratch)?;
        Ok(GrammarRule {
            grammar: self.grammar.clone(),
            index,
            cache: self.cache.clone(),
            stacks,
            partial: Partial::default(),
            scratch,
            eog_logits: Vec::new(),
            shortest: self.shortest.clone(),
            left: None,
        })
    }
}

impl MakeRule for Constraint {
    fn start(&self, tokenizer: &Tokenizer) -> Box<dyn TokenRule> {
        match self.state(tokenizer) {
            Ok(s) => Box::new(s),
            // The grammar was checked when it was compiled; a start that still fails ends
            // generation at once rather than run unconstrained.
            Err(_) => Box::new(EndNow),
        }
    }
}
// ANCHOR_END: constraint_state

/// Allows only the end of generation.
struct EndNow;

impl TokenRule for EndNow {
    fn allows(&mut self, _token: u32) -> bool {
        false
    }
    fn mask(&mut self, _logits: &mut [f32]) {}
    fn accept(&mut self, _token: u32) {}
}

// ANCHOR: grammar_rule
/// One generation's place in a grammar.
pub struct GrammarRule {
    grammar: Arc<Grammar>,
    index: Arc<TokenIndex>,
    cache: Arc<MaskCache>,
    pub stacks: Stacks,
    pub partial: Partial,
    scratch: Scratch,
    eog_logits: Vec<(u32, f32)>, // the end tokens' logits, kept aside while masking
    shortest: Option<Arc<Shortest>>,
    /// The tokens generation may still produce, the next one included, when it has a limit.
    left: Option<usize>,
}

impl GrammarRule {
    /// Whether the text so far is a whole sentence: then the end of generation may come.
    pub fn is_complete(&self) -> bool {
        self.stacks.accepts_here()
    }
}

impl TokenRule for GrammarRule {
    fn allows(&mut self, token: u32) -> bool {
        if self.index.is_eog(token) {
            return self.is_complete();
        }
        match self.index.pieces.get(token as usize) {
            Some(p) if !p.is_empty() && p[0] != 0 => {
                match feed(
                    &self.grammar,
                    &self.stacks,
                    self.partial,
                    p,
                    &mut self.scratch,
                ) {
                    Ok((stacks, partial)) => self.fits(&stacks, partial),
                    Err(_) => false,
                }
            }
            _ => false,
        }
    }

    // ANCHOR_END: grammar_rule
    // ANCHOR: rule_mask
    fn mask(&mut self, logits: &mut [f32]) {
        let allowed =
            self.cache
                .get_or_compute(&self.index, &self.grammar, &self.stacks, self.partial);
        // The end-of-generation tokens are not in the trie's bits: keep their logits aside.
        let eog = &mut self.eog_logits;
        eog.clear();
        eog.extend(
            (self.index.eog.iter()).filter_map(|&t| logits.get(t as usize).map(|&l| (t, l))),
        );
        let mut any = false;
        for (&word, chunk) in allowed.iter().zip(logits.chunks_mut(64)) {
            any |= word != 0;
            if word == u64::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if word >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // The end of generation comes when the text is a whole sentence — or when nothing else
        // can continue it (a dead end, which a grammar over a byte-level vocabulary rarely has).
        if self.is_complete() || !any {
            for &(t, l) in &self.eog_logits {
                logits[t as usize] = l;
            }
        }
        self.mask_budget(logits);
    }

    fn budget(&mut self, tokens_left: usize) {
        self.left = Some(tokens_left);
    }

    fn accept(&mut self, token: u32) {
        if self.index.is_eog(token) {
            return;
        }
        let piece = self.index.pieces.get(token as usize).map_or(&[][..], |p| p);
        if let Ok((stacks, partial)) = feed(
            &self.grammar,
            &self.stacks,
            self.partial,
            piece,
            &mut self.scratch,
        ) {
            self.stacks = stacks;
            self.partial = partial;
        }
    }
}
// ANCHOR_END: rule_mask

/// What a rule that starts in the middle of an answer needs (chapter 19's lazy grammar).
impl GrammarRule {
    /// Move past `text`, written before this rule took over (a lazy grammar starts at its
    /// trigger, in the middle of what the model wrote): whether the grammar accepts it so far.
    pub fn accept_text(&mut self, text: &[u8]) -> bool {
        match feed(
            &self.grammar,
            &self.stacks,
            self.partial,
            text,
            &mut self.scratch,
        ) {
            Ok((stacks, partial)) => {
                self.stacks = stacks;
                self.partial = partial;
                true
            }
            Err(_) => false,
        }
    }

    /// The bytes token `token` writes (empty for an end-of-generation or control token).
    pub fn piece(&self, token: u32) -> &[u8] {
        self.index.pieces.get(token as usize).map_or(&[][..], |p| p)
    }
}

impl GrammarRule {
    // ANCHOR: fits
    /// Whether the state `stacks`, `partial` after the next token can still finish in the
    /// tokens left after it: its fewest bytes at most that many (one token can always write
    /// one byte of the shortest finish). Always, without a budget.
    fn fits(&self, stacks: &Stacks, partial: Partial) -> bool {
        match (self.left, &self.shortest) {
            (Some(left), Some(sh)) => (sh.of(stacks, partial) as usize) < left,
            _ => true,
        }
    }

    /// Near the end of the budget, after the grammar's mask: make sure the likeliest token
    /// left fits. Try the likeliest few, masking those that do not fit; if none does, allow
    /// only the tokens that begin the shortest finish (each fits: it writes that finish's
    /// first bytes).
    fn mask_budget(&mut self, logits: &mut [f32]) {
        let (Some(left), Some(sh)) = (self.left, self.shortest.clone()) else {
            return;
        };
        let need = sh.of(&self.stacks, self.partial) as usize;
        // Tokens tried and masked, given back if none fits (else the sampler has a dead end).
        let (mut tried, mut n_tried) = ([(0usize, 0f32); MAX_BUDGET_TRIES], 0);
        if need < left {
            while n_tried < MAX_BUDGET_TRIES {
                let t = argmax(logits);
                if logits[t] == f32::NEG_INFINITY {
                    break;
                }
                if self.allows(t as u32) {
                    return;
                }
                tried[n_tried] = (t, logits[t]);
                n_tried += 1;
                logits[t] = f32::NEG_INFINITY;
            }
        }
        for &(t, l) in &tried[..n_tried] {
            logits[t] = l;
        }
        if self.partial.n_remain != 0 {
            return; // inside a character: the grammar's mask is all there is
        }
        let Some(finish) = sh.text(&self.grammar, &self.stacks) else {
            return;
        };
        let begins = |p: &[u8]| !p.is_empty() && p[0] != 0 && finish.starts_with(p);
        if !(self.index.pieces.iter()).any(|p| begins(p)) && !finish.is_empty() {
            return; // the vocabulary cannot write it: leave the grammar's mask
        }
        for (t, l) in logits.iter_mut().enumerate() {
            let eog = self.index.is_eog(t as u32);
            let keep = if eog {
                finish.is_empty()
            } else {
                self.index.pieces.get(t).is_some_and(|p| begins(p))
            };
            if !keep {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    // ANCHOR_END: fits
}

/// The index of the largest value (the first of equals).
fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}
