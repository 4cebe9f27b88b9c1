//! The default model's chat template (ChatML) rendered as transformers renders it. The
//! expected strings were produced by jinja2 with transformers' settings (`trim_blocks`,
//! `lstrip_blocks`) from the template stored in the model file.

mod common;

use ch02::chat::MAX_TEMPLATE_FUEL;
use ch02::{ChatTemplate, Message};

fn template() -> ChatTemplate {
    ChatTemplate::from_gguf(&common::gguf("default").gguf).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn two_turns_without_system_get_smollm_default_system_prompt() {
    let conversation = [
        Message::new("user", "What is the capital of France?"),
        Message::new("assistant", "Paris."),
    ];
    let got = template().render(&conversation, false).unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\nParis.<|im_end|>\n"
    );
}

#[test]
fn system_prompt_and_generation_prompt() {
    let conversation = [
        Message::new("system", "Answer briefly."),
        Message::new("user", "What is the capital of France?"),
        Message::new("assistant", "Paris."),
        Message::new("user", "And of Italy?"),
    ];
    let got = template().render(&conversation, true).unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is the capital \
         of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd \
         of Italy?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn rendered_prompt_tokenizes_to_control_tokens_and_back() {
    let tok = common::tokenizer("default");
    let prompt = template()
        .render(&[Message::new("user", "Hi!")], true)
        .unwrap();
    let ids = tok.encode(&prompt, true, true);
    let (im_start, im_end) = (1, 2);
    assert_eq!(ids[0], im_start, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == im_start).count(), 3, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == im_end).count(), 2, "{ids:?}");
    assert!(tok.is_eog(im_end) && !tok.is_eog(im_start));
    assert_eq!(tok.decode(&ids), prompt);
    // Without special parsing the markers are plain text: many more tokens, no control ids.
    let plain = tok.encode(&prompt, true, false);
    assert!(plain.len() > ids.len() && !plain.contains(&im_start));
}

/// `MAX_TEMPLATE_FUEL` leaves a wide margin: a 100-message conversation uses less than a
/// thousandth of it, and a 10 000-message one renders.
#[test]
fn long_conversations_stay_far_inside_the_fuel_limit() {
    let conversation = |n: usize| -> Vec<Message> {
        (0..n)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                Message::new(role, &format!("message {i}"))
            })
            .collect()
    };
    let (_, fuel) = template().render_counted(&conversation(100), true).unwrap();
    assert!(
        fuel * 1000 < MAX_TEMPLATE_FUEL,
        "{fuel} fuel for 100 messages"
    );
    let (text, _) = template()
        .render_counted(&conversation(10_000), true)
        .unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"));
}
