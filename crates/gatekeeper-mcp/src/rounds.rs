//! A server's `input_required` result (protocol 2026-07-28's multi round-trip requests):
//! handed back untouched to an agent that speaks that protocol, answered by the gate for
//! every other caller.
//!
//! On 2026-07-28 a server does not ask its client questions mid-call; it answers the call
//! with `resultType: "input_required"`, the questions (`inputRequests`: elicitation,
//! sampling, roots) and an opaque `requestState`, and the client calls again with its
//! answers (`inputResponses`) and the state echoed. Two callers meet that here:
//! - An agent on 2026-07-28 gets the result as the server sent it, and its retry goes down
//!   as it sent it ([`crate::relay::InputRetry`]): the gate never reads the state.
//! - An agent on an older protocol, and a person's approved send, cannot take such a result.
//!   The gate answers the questions itself through the call's [`Asker`] (the agent's client
//!   by the older protocol's own questions, or the person), the same way as a question the
//!   server asks mid-call on the older protocol, and calls again, at most
//!   [`MAX_INPUT_ROUNDS`] times.
//!
//! What the gate's configuration withholds is withheld here too: without
//! `forward_elicitation` an elicitation is declined, without `forward_sampling` a sampling
//! request fails the call, and roots are always an empty list (the gate offers none).

use rmcp::model::{ClientCapabilities, ClientRequest, InputRequest, InputRequests, InputResponses};
use serde_json::{Value, json};
use tracing::debug;

use crate::relay::{Ask, Asker, InputRetry};

/// The most `input_required` rounds the gate answers for one call before it gives up (the
/// protocol libraries' own default).
pub const MAX_INPUT_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// Answer each of the server's questions through `asker`, within what `allowed` lets
/// through. `Err` says why the call cannot go on (a sampling request nobody may answer).
pub(crate) async fn answer(
    asker: &Asker,
    questions: InputRequests,
    allowed: &ClientCapabilities,
) -> Result<InputResponses, String> {
    let mut answers = InputResponses::new();
    for (key, question) in questions {
        let answer = match question {
            InputRequest::Elicitation(request) => {
                if allowed.elicitation.is_none() {
                    declined(&key, "forward_elicitation is off")
                } else {
                    match asker.put(Ask::Elicitation(request.params)).await {
                        Ok(answer) => answer,
                        Err(why) => declined(&key, &why),
                    }
                }
            }
            #[allow(deprecated)] // sampling: deprecated in the newest revision, in use
            InputRequest::CreateMessage(request) => {
                if allowed.sampling.is_none() {
                    return Err("the server asked for a sampling completion, which the gate does not let through (forward_sampling is off), so it did not complete the call".to_owned());
                }
                asker
                    .put(Ask::Sampling(request.params))
                    .await
                    .map_err(|why| {
                        format!("the server asked for a sampling completion and got none ({why}), so it did not complete the call")
                    })?
            }
            InputRequest::ListRoots(_) => json!({"roots": []}),
            // A kind of question newer than this gate: nothing it could answer truthfully.
            _ => {
                return Err(
                    "the server asked for input of a kind this gate does not know, so it did not complete the call".to_owned(),
                );
            }
        };
        answers.insert(key, answer);
    }
    Ok(answers)
}

fn declined(key: &str, why: &str) -> Value {
    debug!(key, why, "input.elicitation.declined");
    json!({"action": "decline"})
}

/// `request` again, carrying `retry`'s answers and state in its params (for `tools/call`,
/// `prompts/get` and `resources/read`, the requests that may be answered with
/// `input_required`).
pub(crate) fn retried(
    request: &ClientRequest,
    retry: &InputRetry,
) -> Result<ClientRequest, String> {
    let mut raw = serde_json::to_value(request).map_err(|e| e.to_string())?;
    let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut) else {
        return Err("the request has no params to carry the answers".to_owned());
    };
    params.remove("inputResponses");
    params.remove("requestState");
    if let Some(answers) = &retry.input_responses {
        params.insert("inputResponses".to_owned(), json!(answers));
    }
    if let Some(state) = &retry.request_state {
        params.insert("requestState".to_owned(), Value::String(state.clone()));
    }
    serde_json::from_value(raw).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolRequest, CallToolRequestParams};

    use super::*;

    #[test]
    fn a_retry_carries_the_answers_and_the_state_untouched() {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("confirm"),
        ));
        let retry = InputRetry {
            input_responses: Some(InputResponses::from([(
                "ask".to_owned(),
                json!({"action": "accept", "content": {"ok": true}}),
            )])),
            request_state: Some("opaque ✓ state".to_owned()),
        };
        let raw = serde_json::to_value(retried(&request, &retry).unwrap()).unwrap();
        assert_eq!(raw["params"]["name"], "confirm");
        assert_eq!(raw["params"]["requestState"], "opaque ✓ state");
        assert_eq!(
            raw["params"]["inputResponses"]["ask"]["content"]["ok"],
            true
        );
    }

    #[tokio::test]
    async fn questions_the_configuration_withholds_are_declined_or_fail_the_call() {
        let elicit: InputRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {"message": "sure?", "requestedSchema": {"type": "object", "properties": {}}}
        }))
        .unwrap();
        let roots: InputRequest = serde_json::from_value(json!({"method": "roots/list"})).unwrap();
        let answers = answer(
            &Asker::Nobody,
            InputRequests::from([("a".to_owned(), elicit), ("r".to_owned(), roots)]),
            &crate::connection::capabilities(false, true),
        )
        .await
        .unwrap();
        assert_eq!(answers["a"], json!({"action": "decline"}));
        assert_eq!(answers["r"], json!({"roots": []}));
        let sampling: InputRequest = serde_json::from_value(json!({
            "method": "sampling/createMessage",
            "params": {"messages": [], "maxTokens": 5}
        }))
        .unwrap();
        let refused = answer(
            &Asker::Nobody,
            InputRequests::from([("s".to_owned(), sampling)]),
            &crate::connection::capabilities(false, true),
        )
        .await
        .unwrap_err();
        assert!(refused.contains("forward_sampling is off"), "{refused}");
    }
}
