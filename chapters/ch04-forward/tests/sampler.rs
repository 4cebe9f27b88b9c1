//! The sampler on any input: whatever the settings and the logits (NaN, infinities, one
//! token, none), it returns a token of the vocabulary and never panics; `validate` refuses
//! exactly the settings out of their domains.

use ch04::sampling::{Sampler, SamplerParams};
use proptest::prelude::*;

/// Any f32, special values often.
fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -40.0f32..40.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
        1 => any::<f32>(),
    ]
}

fn any_params() -> impl Strategy<Value = SamplerParams> {
    (
        any_f32(),
        0usize..70,
        any_f32(),
        any_f32(),
        any_f32(),
        0usize..70,
        any::<u64>(),
    )
        .prop_map(
            |(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)| SamplerParams {
                temp,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                repeat_last_n,
                seed,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_sampler_returns_a_token_of_the_vocabulary_for_any_input(
        params in any_params(),
        logits in prop::collection::vec(any_f32(), 1..64),
        history in prop::collection::vec(0u32..80, 0..40),
    ) {
        let mut s = Sampler::new(params);
        let t = s.sample(&logits, &history);
        prop_assert!((t as usize) < logits.len(), "token {} of {}", t, logits.len());
    }

    #[test]
    fn validate_refuses_exactly_what_is_out_of_domain(params in any_params()) {
        let unit = |x: f32| (0.0..=1.0).contains(&x);
        let ok = params.temp.is_finite()
            && unit(params.top_p)
            && unit(params.min_p)
            && params.repeat_penalty.is_finite()
            && params.repeat_penalty > 0.0;
        let got = params.validate();
        prop_assert_eq!(got.is_ok(), ok, "{:?}: {:?}", params, got);
        if let Err(e) = got {
            // The message names the setting and its value.
            prop_assert!(e.to_string().starts_with(e.name), "{}", e);
        }
    }
}

#[test]
fn an_empty_vocabulary_gives_token_0_without_a_panic() {
    let mut s = Sampler::new(SamplerParams::default());
    assert_eq!(s.sample(&[], &[]), 0);
}

#[test]
fn all_nan_logits_still_give_a_token() {
    let mut s = Sampler::new(SamplerParams::default());
    let t = s.sample(&[f32::NAN; 8], &[]);
    assert!(t < 8);
}
