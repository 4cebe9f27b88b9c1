//! The endpoints: `/health`, `/v1/models`, and the two that generate,
//! `/v1/chat/completions` and `/v1/completions`, which read and check a request, take its
//! place, tokenize its prompt, and hand it to [`generate`](super::generate::generate).

use super::generate::{Generate, generate};
use super::place::Place;
use super::{AppState, CachePartition, Loaded, Preparing, RequestLabel};
use crate::api::{
    ApiError, Cancel, Chat, ChatRequest, CompletionRequest, Endpoint, Prompt, Sampling, TextBound,
};
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

// Only for the documentation's links:
#[cfg(doc)]
use super::max_text_bytes;

/// `GET /health`: 200 `{"status": "ok", …}` once the model is loaded, with the scheduler's
/// state; 503 `{"status": "loading"}` before.
pub(super) async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.loaded.get() {
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading"})),
        )
            .into_response(),
        Some(l) if !l.worker.is_alive() => {
            ApiError::internal("the engine thread has stopped").into_response()
        }
        Some(l) => {
            let mut v = json!({"status": "ok", "in_flight": s.in_flight()});
            v["scheduler"] = serde_json::to_value(l.worker.status()).unwrap_or(Value::Null);
            axum::Json(v).into_response()
        }
    }
}

/// `GET /v1/models`: the one model.
pub(super) async fn models(State(s): State<Arc<AppState>>) -> Response {
    match model_card(&s) {
        None => ApiError::loading().into_response(),
        Some(card) => axum::Json(json!({"object": "list", "data": [card]})).into_response(),
    }
}

/// The model's entry in `/v1/models`; `None` while it loads.
pub fn model_card(s: &AppState) -> Option<Value> {
    let l = s.loaded.get()?;
    let c = &l.engine.model.config;
    Some(json!({
        "id": l.model_id,
        "object": "model",
        "created": s.started,
        "owned_by": "llm-rs",
        "meta": {
            "n_ctx": l.n_ctx,
            "n_ctx_train": c.context_length,
            "n_vocab": c.vocab_size,
            "n_layer": c.n_layer,
            "parallel": l.parallel,
        },
    }))
}

/// The body, read within the server's limit: 413 over it, 400 if it cannot be read.
pub async fn read_body(s: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let limit = s.body_limit();
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid("body", e.to_string())
        }
    })
}

/// The body, read and parsed: 413 over the limit, 400 for anything else.
async fn parse<T: serde::de::DeserializeOwned>(
    s: &AppState,
    body: Body,
) -> Result<(T, Bytes), ApiError> {
    let bytes = read_body(s, body).await?;
    let parsed = serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_json(&e))?;
    Ok((parsed, bytes))
}

/// Whether reading a body failed because it passed the limit.
pub fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Refuse a prompt of `bytes` bytes of text that cannot fit the context (see
/// [`max_text_bytes`]), before tokenizing it.
fn check_text_bytes(l: &Loaded, param: &'static str, bytes: usize) -> Result<(), ApiError> {
    match l.max_text_bytes {
        Some(max) if bytes > max => Err(ApiError::too_long_text(param, bytes, max, l.n_ctx)),
        _ => Ok(()),
    }
}

/// The text of the request's `prediction`, checked as any text is before it is tokenized.
fn prediction(l: &Loaded, sampling: &Sampling) -> Result<Option<String>, ApiError> {
    let predicted = sampling.prediction()?;
    if let Some(p) = &predicted {
        check_text_bytes(l, "prediction", p.len())?;
    }
    Ok(predicted)
}

fn check_model(l: &Loaded, asked: Option<&str>) -> Result<(), ApiError> {
    match asked {
        Some(m) if !m.is_empty() && m != l.model_id => Err(ApiError::unknown_model(m, &l.model_id)),
        _ => Ok(()),
    }
}

// ANCHOR: chat
/// `POST /v1/chat/completions`. (Public, with [`completions`], for a later chapter's
/// endpoints that answer through it.)
pub async fn chat(
    State(s): State<Arc<AppState>>,
    label: Option<Extension<RequestLabel>>,
    partition: Option<Extension<CachePartition>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let run = async {
        let deadline = Instant::now() + s.limits.timeout;
        let l = s.loaded.get().ok_or_else(ApiError::loading)?;
        // Reading, parsing and tokenizing take turns (`Limits::preparing`).
        let turn = match turn {
            Some(Extension(t)) => t,
            None => s.preparing().await,
        };
        let (mut req, body): (ChatRequest, _) = parse(&s, body).await?;
        check_model(l, req.sampling.model.as_deref())?;
        // The fields the conversation's reader takes (a later chapter's `tools`, say) are its
        // own to check.
        for field in l.chats.fields() {
            req.sampling.rest.remove(*field);
        }
        let (mut params, asked) = req.sampling.params()?;
        let predicted = prediction(l, &req.sampling)?;
        if l.engine.template.is_none() {
            return Err(ApiError::invalid(
                "messages",
                "the model file has no chat template; use /v1/completions",
            ));
        }
        // From here on the request holds a place: what is done for it counts.
        let place = Place::take(&s, l)?;
        // Reading the conversation, rendering and tokenizing it take milliseconds: off the
        // runtime.
        let (engine, chats, text) = (Arc::clone(&l.engine), Arc::clone(&l.chats), body.clone());
        let bound = TextBound {
            max_bytes: l.max_text_bytes,
            n_ctx: l.n_ctx,
        };
        let (chat, predicted) = place
            .prepare(deadline, None, move |_| {
                // The body parsed as JSON: it is UTF-8.
                let text = std::str::from_utf8(&text)
                    .map_err(|e| ApiError::invalid("body", e.to_string()))?;
                let template = engine.template.as_ref().expect("checked above");
                let chat = chats.open(text, template, &engine.tokenizer, bound)?;
                let predicted = predicted.map(|p| engine.tokenizer.encode(&p, false, false));
                Ok((chat, predicted))
            })
            .await?;
        turn.done();
        // ANCHOR_END: chat
        // ANCHOR: chat_rule
        let Chat {
            prompt,
            rule,
            reader,
        } = chat;
        // The form's rule, the conversation's (tool calls held to their schemas), or the one
        // `params` set (`ignore_eos`): one of them.
        let form = place.form(&s, l, body, &req.sampling, deadline).await?;
        if form.is_some() && rule.is_some() {
            return Err(ApiError::invalid(
                "response_format",
                "`response_format` cannot be combined with tool calls held to their schemas \
                 (set `tool_choice` to \"none\", or leave `response_format` out)",
            ));
        }
        params.rule = form.or(rule).or(params.rule.take());
        let mut request =
            Generate::new(Endpoint::Chat, label, prompt, params, asked, &req.sampling);
        request.reader = Some(reader);
        request.partition = partition.map_or(0, |Extension(CachePartition(p))| p);
        request.lookahead = l.lookaheads.lookahead(
            request.prompt_len(),
            predicted.unwrap_or_default(),
            &req.sampling,
        );
        generate(&s, l, request, place, deadline).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
// ANCHOR_END: chat_rule

/// `POST /v1/completions`. The prompt is the client's whole text, as in llama-server: special
/// tokens written in it are parsed (there is no template whose markers to protect).
pub async fn completions(
    State(s): State<Arc<AppState>>,
    label: Option<Extension<RequestLabel>>,
    partition: Option<Extension<CachePartition>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let run = async {
        let deadline = Instant::now() + s.limits.timeout;
        let l = s.loaded.get().ok_or_else(ApiError::loading)?;
        let turn = match turn {
            Some(Extension(t)) => t,
            None => s.preparing().await,
        };
        let (req, body): (CompletionRequest, _) = parse(&s, body).await?;
        check_model(l, req.sampling.model.as_deref())?;
        let (mut params, asked) = req.sampling.params()?;
        let prompt = req.prompt()?;
        if let Prompt::Text(text) = &prompt {
            check_text_bytes(l, "prompt", text.len())?;
        }
        let predicted = prediction(l, &req.sampling)?;
        let place = Place::take(&s, l)?;
        let engine = Arc::clone(&l.engine);
        let tokenize = move |_: &Cancel| {
            let prompt = match prompt {
                Prompt::Tokens(ids) => ids,
                Prompt::Text(text) => engine.tokenizer.encode(&text, true, true),
                Prompt::Texts(_) => unreachable!("prompt() returns one text"),
            };
            let predicted = predicted.map(|p| engine.tokenizer.encode(&p, false, false));
            Ok((prompt, predicted))
        };
        let (prompt, predicted) = place.prepare(deadline, None, tokenize).await?;
        turn.done();
        // The form's rule, or the one `params` set (`ignore_eos`; never both, `params` says).
        let form = place.form(&s, l, body, &req.sampling, deadline).await?;
        params.rule = form.or(params.rule.take());
        // Token ids outside the vocabulary are refused by the scheduler's `submit` (a 400).
        let mut request = Generate::new(
            Endpoint::Completions,
            label,
            prompt,
            params,
            asked,
            &req.sampling,
        );
        request.partition = partition.map_or(0, |Extension(CachePartition(p))| p);
        request.lookahead = l.lookaheads.lookahead(
            request.prompt_len(),
            predicted.unwrap_or_default(),
            &req.sampling,
        );
        generate(&s, l, request, place, deadline).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
