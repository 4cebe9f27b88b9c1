//! A conversation reuses its KV cache across turns without changing a bit: the logits of a
//! turn computed on top of the kept prefix equal those of a fresh cache over the whole
//! conversation, and the prefix kept is the earlier turns'.

use ch10::ch08::sampling::SamplerParams;
use ch10::engine::{Engine, LoadMode};
use ch10::{
    Chat, FastLoader, GenParams, MapOptions, Message, PoolKind, PrefixSession, Session, new_pool,
};
use std::sync::OnceLock;

/// Chapter 8's matrices over the file's own rows (no repacking), on one thread.
fn fast() -> FastLoader {
    let mut f = FastLoader::new(new_pool(PoolKind::Spin, 1));
    f.pack = false;
    f
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
        Engine::load(&path, LoadMode::Map(MapOptions::default()), fast()).unwrap()
    })
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_second_turn_reuses_the_first_and_computes_the_same_logits() {
    let e = engine();
    let template = e
        .template
        .as_ref()
        .expect("the default model has a chat template");
    let mut chat = Chat::new(&e.model, &e.tokenizer, template, Some("Be concise."), 256);
    let params = GenParams {
        max_tokens: 4,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
    };
    let first = chat
        .turn("Name three colors.", &params, &mut |_| {})
        .unwrap();
    assert_eq!(first.reused, 0);
    assert_eq!(chat.messages.len(), 3, "system, user, assistant");

    chat.messages.push(Message::new("user", "And two animals?"));
    let ids = chat.prompt_ids().unwrap();
    let kept = chat.session.reusable(&ids);
    // At least the whole first prompt is kept (the answer, re-tokenized, usually too).
    assert!(
        kept >= first.generation.prompt_ids.len(),
        "kept {kept} of {} tokens, the first prompt had {}",
        ids.len(),
        first.generation.prompt_ids.len()
    );
    assert_eq!(ids[..kept], chat.session.cached()[..kept]);
    let reused = chat.session.next_logits(&ids, ids.len()).unwrap();
    let fresh = PrefixSession::new(&e.model, 256)
        .next_logits(&ids, ids.len())
        .unwrap()
        .to_vec();
    assert_eq!(bits(reused), bits(&fresh));
    assert_eq!(chat.session.cached(), &ids[..]);
}

#[test]
fn the_cache_follows_any_sequence_and_survives_a_full_cache() {
    let e = engine();
    let mut s = PrefixSession::new(&e.model, 8);
    let a = [1u32, 2, 3, 4, 5];
    s.next_logits(&a, a.len()).unwrap();
    assert_eq!(s.cached(), &a);
    // The same sequence again: all but the last token are kept, the last is recomputed.
    assert_eq!(s.reusable(&a), 4);
    // A sequence that diverges at index 2 keeps two tokens.
    let b = [1u32, 2, 9, 9];
    assert_eq!(s.reusable(&b), 2);
    let got = s.next_logits(&b, 1).unwrap().to_vec();
    assert_eq!(s.cached(), &b);
    let want = PrefixSession::new(&e.model, 8)
        .next_logits(&b, b.len())
        .unwrap()
        .to_vec();
    assert_eq!(bits(&got), bits(&want));
    // Past the capacity: an error, and the session still knows what its cache holds.
    let long: Vec<u32> = (1..=12).collect();
    let err = s.next_logits(&long, 10).unwrap_err();
    assert!(err.to_string().contains('8'), "{err}");
    // The whole batch was refused before anything was written: only the kept prefix remains.
    assert_eq!(s.cached(), &long[..2]);
    let got = s.next_logits(&a, 1).unwrap().to_vec();
    let want = PrefixSession::new(&e.model, 8)
        .next_logits(&a, a.len())
        .unwrap()
        .to_vec();
    assert_eq!(bits(&got), bits(&want));
}
