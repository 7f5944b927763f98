//! The simulator for `@modelcontextprotocol/server-memory` (written against 2026.8.31).
//!
//! The server keeps one knowledge graph (entities with observations, and relations) and
//! answers every read from the whole graph, so a touched read is simulated from one real
//! `read_graph`: the agent's pending writes are applied to it in staging order exactly as
//! the server applies them (`create_*` skip what already exists before the call,
//! `add_observations` fails whole for an unknown entity, deletions of what is not there do
//! nothing), then the read's own filter runs on the result. Whatever a pending action
//! added is named in the note with its action id, and so is whatever it removed.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{
    Answer, Basis, Expectation, JsValue, PendingWrite, ReadCall, RealReads, Simulator, Target,
    actions_phrase, fingerprint, simulated, text_of,
};

/// The simulator for the reference memory (knowledge graph) server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory;

const WRITES: &[&str] = &[
    "create_entities",
    "create_relations",
    "add_observations",
    "delete_entities",
    "delete_observations",
    "delete_relations",
];

const EXPECTS: &[Expectation] = &[
    ("create_entities", &[("entities", "array")]),
    ("create_relations", &[("relations", "array")]),
    ("add_observations", &[("observations", "array")]),
    ("delete_entities", &[("entityNames", "array")]),
    ("delete_observations", &[("deletions", "array")]),
    ("delete_relations", &[("relations", "array")]),
    ("read_graph", &[]),
    ("search_nodes", &[("query", "string")]),
    ("open_nodes", &[("names", "array")]),
];

#[derive(Debug, Clone, PartialEq)]
struct Entity {
    name: String,
    entity_type: String,
    /// Each observation, with the pending action that added it.
    observations: Vec<(String, Option<u64>)>,
    /// The pending action that created it.
    by: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
struct Relation {
    from: String,
    to: String,
    relation_type: String,
    by: Option<u64>,
}

impl Relation {
    fn same(&self, other: &Relation) -> bool {
        self.from == other.from && self.to == other.to && self.relation_type == other.relation_type
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Graph {
    entities: Vec<Entity>,
    relations: Vec<Relation>,
    /// What pending actions removed, for the note.
    removed: Vec<(String, u64)>,
    /// Pending actions that would fail if applied now, with why.
    failing: Vec<(u64, String)>,
}

fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    value?
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn str_of(value: &Value, key: &str) -> Option<String> {
    value.get(key)?.as_str().map(str::to_owned)
}

fn relation_of(value: &Value, by: Option<u64>) -> Option<Relation> {
    Some(Relation {
        from: str_of(value, "from")?,
        to: str_of(value, "to")?,
        relation_type: str_of(value, "relationType")?,
        by,
    })
}

/// The list `key` of `args` as (entity name, its strings under `inner`) pairs, as
/// `add_observations` and `delete_observations` take them; `None` if any is malformed.
fn per_entity(args: &Value, key: &str, inner: &str) -> Option<Vec<(String, Vec<String>)>> {
    items(args, key)?
        .iter()
        .map(|o| Some((str_of(o, "entityName")?, strings(o.get(inner))?)))
        .collect()
}

fn items<'a>(args: &'a Value, key: &str) -> Option<&'a Vec<Value>> {
    args.get(key)?.as_array()
}

impl Graph {
    /// The graph as the server's `read_graph` answered it.
    fn parse(answer: &Value) -> Option<Self> {
        let entities = items(answer, "entities")?
            .iter()
            .map(|e| {
                Some(Entity {
                    name: str_of(e, "name")?,
                    entity_type: str_of(e, "entityType")?,
                    observations: strings(e.get("observations"))?
                        .into_iter()
                        .map(|o| (o, None))
                        .collect(),
                    by: None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let relations = items(answer, "relations")?
            .iter()
            .map(|r| relation_of(r, None))
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            entities,
            relations,
            ..Self::default()
        })
    }

    /// Remove the relations `gone` picks, each noted as deleted by action `id` (`how`
    /// says more, as " with its entity").
    fn drop_relations(&mut self, id: u64, how: &str, gone: impl Fn(&Relation) -> bool) {
        let removed = &mut self.removed;
        self.relations.retain(|r| {
            let drop = gone(r);
            if drop {
                removed.push((
                    format!(
                        "relation {:?} {:?} {:?} deleted{how}",
                        r.from, r.relation_type, r.to
                    ),
                    id,
                ));
            }
            !drop
        });
    }

    fn fail(&mut self, id: u64, why: impl Into<String>) {
        self.failing.push((id, why.into()));
    }

    /// Apply one pending write as the server does. `Err` for a tool this model does not
    /// know.
    fn apply(&mut self, write: &PendingWrite) -> Result<(), String> {
        let id = write.action;
        let args = &write.args;
        let invalid = "its arguments do not fit the tool's schema, so the server would refuse it";
        match write.tool.as_str() {
            "create_entities" => {
                let Some(new) = items(args, "entities").and_then(|list| {
                    list.iter()
                        .map(|e| {
                            Some(Entity {
                                name: str_of(e, "name")?,
                                entity_type: str_of(e, "entityType")?,
                                observations: strings(e.get("observations"))?
                                    .into_iter()
                                    .map(|o| (o, Some(id)))
                                    .collect(),
                                by: Some(id),
                            })
                        })
                        .collect::<Option<Vec<_>>>()
                }) else {
                    self.fail(id, invalid);
                    return Ok(());
                };
                let fresh: Vec<Entity> = new
                    .into_iter()
                    .filter(|e| !self.entities.iter().any(|x| x.name == e.name))
                    .collect();
                self.entities.extend(fresh);
            }
            "create_relations" | "delete_relations" => {
                let Some(given) = items(args, "relations").and_then(|list| {
                    list.iter()
                        .map(|r| relation_of(r, Some(id)))
                        .collect::<Option<Vec<_>>>()
                }) else {
                    self.fail(id, invalid);
                    return Ok(());
                };
                if write.tool == "create_relations" {
                    let fresh: Vec<Relation> = given
                        .into_iter()
                        .filter(|r| !self.relations.iter().any(|x| x.same(r)))
                        .collect();
                    self.relations.extend(fresh);
                } else {
                    self.drop_relations(id, "", |r| given.iter().any(|g| g.same(r)));
                }
            }
            "add_observations" => {
                let Some(list) = per_entity(args, "observations", "contents") else {
                    self.fail(id, invalid);
                    return Ok(());
                };
                // The server fails the whole call for an unknown entity, saving nothing.
                let mut entities = self.entities.clone();
                for (name, contents) in list {
                    let Some(entity) = entities.iter_mut().find(|e| e.name == name) else {
                        self.fail(id, format!("there is no entity {name:?}"));
                        return Ok(());
                    };
                    let fresh: Vec<String> = contents
                        .into_iter()
                        .filter(|c| !entity.observations.iter().any(|(o, _)| o == c))
                        .collect();
                    entity
                        .observations
                        .extend(fresh.into_iter().map(|c| (c, Some(id))));
                }
                self.entities = entities;
            }
            "delete_entities" => {
                let Some(names) = strings(args.get("entityNames")) else {
                    self.fail(id, invalid);
                    return Ok(());
                };
                let removed = &mut self.removed;
                self.entities.retain(|e| {
                    let gone = names.contains(&e.name);
                    if gone {
                        removed.push((format!("entity {:?} deleted", e.name), id));
                    }
                    !gone
                });
                self.drop_relations(id, " with its entity", |r| {
                    names.contains(&r.from) || names.contains(&r.to)
                });
            }
            "delete_observations" => {
                let Some(list) = per_entity(args, "deletions", "observations") else {
                    self.fail(id, invalid);
                    return Ok(());
                };
                for (name, observations) in list {
                    if let Some(entity) = self.entities.iter_mut().find(|e| e.name == name) {
                        let removed = &mut self.removed;
                        entity.observations.retain(|(o, _)| {
                            let gone = observations.contains(o);
                            if gone {
                                removed
                                    .push((format!("observation {o:?} of {name:?} deleted"), id));
                            }
                            !gone
                        });
                    }
                }
            }
            other => {
                return Err(format!(
                    "action {id} calls {other}, which the gate does not model"
                ));
            }
        }
        Ok(())
    }

    /// The part of the graph a read shows.
    fn view(&self, read: ReadCall<'_>) -> Option<(Vec<&Entity>, Vec<&Relation>)> {
        let entities: Vec<&Entity> = match read.tool {
            "read_graph" => {
                return Some((
                    self.entities.iter().collect(),
                    self.relations.iter().collect(),
                ));
            }
            "search_nodes" => {
                let query = read.args.get("query")?.as_str()?.to_lowercase();
                self.entities
                    .iter()
                    .filter(|e| {
                        e.name.to_lowercase().contains(&query)
                            || e.entity_type.to_lowercase().contains(&query)
                            || e.observations
                                .iter()
                                .any(|(o, _)| o.to_lowercase().contains(&query))
                    })
                    .collect()
            }
            "open_nodes" => {
                let names = strings(read.args.get("names"))?;
                self.entities
                    .iter()
                    .filter(|e| names.contains(&e.name))
                    .collect()
            }
            _ => return None,
        };
        let relations = self
            .relations
            .iter()
            .filter(|r| entities.iter().any(|e| e.name == r.from || e.name == r.to))
            .collect();
        Some((entities, relations))
    }
}

impl Entity {
    /// Its fingerprint: a hash of its type and observations, in order.
    fn state(&self) -> String {
        let mut text = self.entity_type.clone();
        for (o, _) in &self.observations {
            text.push('\n');
            text.push_str(o);
        }
        fingerprint(&text).replacen("content", "type and observations", 1)
    }

    /// The pending actions that made it what it is (created it, added observations).
    fn made_by(&self) -> Vec<u64> {
        let mut by: Vec<u64> = self
            .by
            .iter()
            .chain(self.observations.iter().filter_map(|(_, by)| by.as_ref()))
            .copied()
            .collect();
        by.sort_unstable();
        by.dedup();
        by
    }
}

/// The entity names and relations a write names (a relation as `(from, type, to)`).
fn named(write: &PendingWrite) -> (Vec<String>, Vec<(String, String, String)>) {
    let args = &write.args;
    let mut names = Vec::new();
    let mut relations = Vec::new();
    let list = |key: &str| items(args, key).cloned().unwrap_or_default();
    match write.tool.as_str() {
        "create_entities" => {
            names.extend(list("entities").iter().filter_map(|e| str_of(e, "name")))
        }
        "add_observations" | "delete_observations" => {
            let key = if write.tool == "add_observations" {
                "observations"
            } else {
                "deletions"
            };
            names.extend(list(key).iter().filter_map(|o| str_of(o, "entityName")));
        }
        "delete_entities" => names.extend(strings(args.get("entityNames")).unwrap_or_default()),
        "create_relations" | "delete_relations" => {
            for r in list("relations") {
                if let Some(r) = relation_of(&r, None) {
                    names.push(r.from.clone());
                    names.push(r.to.clone());
                    relations.push((r.from, r.relation_type, r.to));
                }
            }
        }
        _ => {}
    }
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    (names, relations)
}

fn graph_js(entities: &[&Entity], relations: &[&Relation]) -> JsValue {
    let entities = entities
        .iter()
        .map(|e| {
            JsValue::Obj(vec![
                ("name", JsValue::Str(e.name.clone())),
                ("entityType", JsValue::Str(e.entity_type.clone())),
                (
                    "observations",
                    JsValue::Arr(
                        e.observations
                            .iter()
                            .map(|(o, _)| JsValue::Str(o.clone()))
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    let relations = relations
        .iter()
        .map(|r| {
            JsValue::Obj(vec![
                ("from", JsValue::Str(r.from.clone())),
                ("to", JsValue::Str(r.to.clone())),
                ("relationType", JsValue::Str(r.relation_type.clone())),
            ])
        })
        .collect();
    JsValue::Obj(vec![
        ("entities", JsValue::Arr(entities)),
        ("relations", JsValue::Arr(relations)),
    ])
}

#[async_trait]
impl Simulator for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn expects(&self) -> &'static [Expectation] {
        EXPECTS
    }

    fn models(&self, tool: &str) -> bool {
        WRITES.contains(&tool)
    }

    fn touches(&self, read: ReadCall<'_>, pending: &[PendingWrite]) -> bool {
        // Every read of this server is answered from the whole graph.
        !pending.is_empty() && matches!(read.tool, "read_graph" | "search_nodes" | "open_nodes")
    }

    async fn simulate(
        &self,
        read: ReadCall<'_>,
        pending: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Answer {
        let all: Vec<u64> = pending.iter().map(|w| w.action).collect();
        let cannot = |reason: String| Answer::Cannot {
            reason,
            actions: all.clone(),
        };
        let answer = match real.read("read_graph", json!({})).await {
            Ok(answer) if !answer.is_error => answer,
            Ok(answer) => {
                return cannot(format!(
                    "the server could not read the graph ({})",
                    text_of(&answer).unwrap_or_default()
                ));
            }
            Err(reason) => return cannot(reason),
        };
        let parsed = answer
            .structured_content
            .clone()
            .or_else(|| text_of(&answer).and_then(|t| serde_json::from_str(t).ok()));
        let Some(mut graph) = parsed.as_ref().and_then(Graph::parse) else {
            return cannot(
                "the server's read_graph answer is not the graph the gate knows".to_owned(),
            );
        };
        for write in pending {
            if let Err(reason) = graph.apply(write) {
                return cannot(reason);
            }
        }
        let Some((entities, relations)) = graph.view(read) else {
            return Answer::Untouched; // Arguments the server refuses: its own answer says so.
        };
        let mut lines = Vec::new();
        let mut shown: Vec<u64> = Vec::new();
        for e in &entities {
            if let Some(id) = e.by {
                lines.push(format!(
                    "entity {:?} created ({})",
                    e.name,
                    actions_phrase(&[id])
                ));
                shown.push(id);
            }
            for (o, by) in &e.observations {
                if let Some(id) = by
                    && *by != e.by
                {
                    lines.push(format!(
                        "observation {o:?} added to {:?} ({})",
                        e.name,
                        actions_phrase(&[*id])
                    ));
                    shown.push(*id);
                }
            }
        }
        for r in &relations {
            if let Some(id) = r.by {
                lines.push(format!(
                    "relation {:?} {:?} {:?} created ({})",
                    r.from,
                    r.relation_type,
                    r.to,
                    actions_phrase(&[id])
                ));
                shown.push(id);
            }
        }
        for (what, id) in &graph.removed {
            lines.push(format!("{what} ({})", actions_phrase(&[*id])));
            shown.push(*id);
        }
        for (id, why) in &graph.failing {
            lines.push(format!(
                "action {id} is not shown: applied now, it would fail ({why})"
            ));
            shown.push(*id);
        }
        shown.sort_unstable();
        shown.dedup();
        let js = graph_js(&entities, &relations);
        let note = format!(
            "Simulated by the gate: this answer shows your pending {} as if a person had approved {}; nothing has been applied yet.{}",
            actions_phrase(&shown),
            if shown.len() == 1 { "it" } else { "them" },
            lines.iter().map(|l| format!("\n- {l}")).collect::<String>()
        );
        if shown.is_empty() {
            // Nothing pending shows in this read: it is the real graph's answer.
            return Answer::Untouched;
        }
        Answer::Simulated(simulated(
            note,
            js.pretty(),
            Some(js.to_value()),
            false,
            &shown,
        ))
    }

    /// A write's targets are the entities it names (each fingerprinted by its type and
    /// observations, or `absent`) and the relations it creates or deletes, from one real
    /// `read_graph` with the pending writes before it applied. It is built on the actions
    /// that created an entity it adds observations to, relates or deletes, that added an
    /// observation it deletes, or that created a relation it deletes; `create_entities`
    /// is built on nothing (the server skips a name that exists).
    async fn basis(
        &self,
        write: &PendingWrite,
        before: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Result<Basis, String> {
        if !self.models(&write.tool) {
            return Err(format!("{} is not a write the gate models", write.tool));
        }
        let answer = real.read("read_graph", json!({})).await?;
        if answer.is_error {
            return Err(format!(
                "the server could not read the graph ({})",
                text_of(&answer).unwrap_or_default()
            ));
        }
        let parsed = answer
            .structured_content
            .clone()
            .or_else(|| text_of(&answer).and_then(|t| serde_json::from_str(t).ok()));
        let Some(mut graph) = parsed.as_ref().and_then(Graph::parse) else {
            return Err(
                "the server's read_graph answer is not the graph the gate knows".to_owned(),
            );
        };
        for earlier in before {
            graph.apply(earlier)?;
        }
        let (names, relations) = named(write);
        let mut targets = Vec::new();
        let mut built_on = std::collections::BTreeSet::new();
        let deleted: Vec<String> = items(&write.args, "deletions")
            .into_iter()
            .flatten()
            .filter_map(|d| strings(d.get("observations")))
            .flatten()
            .collect();
        for name in names {
            let entity = graph.entities.iter().find(|e| e.name == name);
            let target = match entity {
                Some(entity) => {
                    if write.tool != "create_entities" {
                        built_on.extend(entity.by);
                    }
                    if write.tool == "delete_observations" {
                        built_on.extend(
                            entity
                                .observations
                                .iter()
                                .filter(|(o, _)| deleted.contains(o))
                                .filter_map(|(_, by)| *by),
                        );
                    }
                    Target {
                        name: format!("entity {name:?}"),
                        state: entity.state(),
                        by: entity.made_by(),
                    }
                }
                None => Target {
                    name: format!("entity {name:?}"),
                    state: "absent".to_owned(),
                    by: Vec::new(),
                },
            };
            targets.push(target);
        }
        if write.tool == "delete_relations" {
            for (from, relation_type, to) in relations {
                let found = graph
                    .relations
                    .iter()
                    .find(|r| r.from == from && r.relation_type == relation_type && r.to == to);
                built_on.extend(found.and_then(|r| r.by));
                targets.push(Target {
                    name: format!("relation {from:?} {relation_type:?} {to:?}"),
                    state: if found.is_some() { "present" } else { "absent" }.to_owned(),
                    by: found.and_then(|r| r.by).into_iter().collect(),
                });
            }
        }
        Ok(Basis {
            targets,
            built_on: built_on.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use gatekeeper_core::ToolResult;

    use super::*;

    /// The real server's graph, answered as `read_graph` answers it.
    struct Real(Value, Mutex<HashMap<String, usize>>);

    #[async_trait]
    impl RealReads for Real {
        async fn read(&self, tool: &str, _args: Value) -> Result<ToolResult, String> {
            *self.1.lock().unwrap().entry(tool.to_owned()).or_default() += 1;
            assert_eq!(tool, "read_graph");
            let mut result = ToolResult::from_text(serde_json::to_string_pretty(&self.0).unwrap());
            result.structured_content = Some(self.0.clone());
            Ok(result)
        }
    }

    fn real() -> Real {
        Real(
            json!({
                "entities": [
                    {"name": "Ada", "entityType": "person", "observations": ["wrote notes"]},
                    {"name": "Bob", "entityType": "person", "observations": []}
                ],
                "relations": [{"from": "Ada", "to": "Bob", "relationType": "knows"}]
            }),
            Mutex::default(),
        )
    }

    fn write(action: u64, tool: &str, args: Value) -> PendingWrite {
        PendingWrite {
            action,
            tool: tool.into(),
            args,
        }
    }

    async fn run(read: &str, args: Value, pending: &[PendingWrite]) -> (Value, String) {
        let answer = Memory
            .simulate(
                ReadCall {
                    tool: read,
                    args: &args,
                },
                pending,
                &real(),
            )
            .await;
        let Answer::Simulated(result) = answer else {
            panic!("not simulated: {answer:?}")
        };
        let note = text_of(&result).unwrap().to_owned();
        let gatekeeper_core::Content::Text { text } = &result.content[1] else {
            panic!()
        };
        let shown: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            Some(&shown),
            result.structured_content.as_ref(),
            "text and structure agree"
        );
        (shown, note)
    }

    #[tokio::test]
    async fn created_entities_relations_and_observations_show_in_every_read_marked() {
        let pending = [
            write(
                3,
                "create_entities",
                json!({"entities": [
                    {"name": "Cy", "entityType": "robot", "observations": ["beeps"]},
                    {"name": "Ada", "entityType": "dup", "observations": []}
                ]}),
            ),
            write(
                4,
                "create_relations",
                json!({"relations": [{"from": "Cy", "to": "Ada", "relationType": "serves"}]}),
            ),
            write(
                5,
                "add_observations",
                json!({"observations": [{"entityName": "Bob", "contents": ["likes tea", "likes tea"]}]}),
            ),
        ];
        let (graph, note) = run("read_graph", json!({}), &pending).await;
        assert_eq!(
            graph["entities"].as_array().unwrap().len(),
            3,
            "Ada is not created twice"
        );
        assert_eq!(
            graph["entities"][1]["observations"],
            json!(["likes tea", "likes tea"])
        );
        assert_eq!(graph["entities"][2]["name"], "Cy");
        assert_eq!(graph["relations"][1]["relationType"], "serves");
        assert!(note.contains("actions 3, 4 and 5"), "{note}");
        assert!(note.contains("entity \"Cy\" created (action 3)"), "{note}");
        assert!(
            note.contains("observation \"likes tea\" added to \"Bob\" (action 5)"),
            "{note}"
        );

        let (found, _) = run("search_nodes", json!({"query": "BEEP"}), &pending).await;
        assert_eq!(found["entities"].as_array().unwrap().len(), 1);
        assert_eq!(
            found["relations"].as_array().unwrap().len(),
            1,
            "Cy serves Ada"
        );

        let (opened, _) = run("open_nodes", json!({"names": ["Cy"]}), &pending).await;
        assert_eq!(opened["entities"][0]["observations"], json!(["beeps"]));
    }

    #[tokio::test]
    async fn deletions_remove_and_the_note_names_what_went() {
        let pending = [
            write(7, "delete_entities", json!({"entityNames": ["Bob"]})),
            write(
                8,
                "delete_observations",
                json!({"deletions": [{"entityName": "Ada", "observations": ["wrote notes"]}]}),
            ),
        ];
        let (graph, note) = run("read_graph", json!({}), &pending).await;
        assert_eq!(
            graph["entities"],
            json!([{"name": "Ada", "entityType": "person", "observations": []}])
        );
        assert_eq!(graph["relations"], json!([]));
        assert!(note.contains("entity \"Bob\" deleted (action 7)"), "{note}");
        assert!(
            note.contains("deleted with its entity (action 7)"),
            "{note}"
        );
        assert!(
            note.contains("observation \"wrote notes\" of \"Ada\" deleted (action 8)"),
            "{note}"
        );
    }

    #[tokio::test]
    async fn an_observation_for_an_unknown_entity_fails_whole_and_says_so() {
        let pending = [write(
            9,
            "add_observations",
            json!({"observations": [
                {"entityName": "Ada", "contents": ["x"]},
                {"entityName": "Nobody", "contents": ["y"]}
            ]}),
        )];
        let (graph, note) = run("read_graph", json!({}), &pending).await;
        assert_eq!(
            graph["entities"][0]["observations"],
            json!(["wrote notes"]),
            "nothing saved"
        );
        assert!(
            note.contains(
                "action 9 is not shown: applied now, it would fail (there is no entity \"Nobody\")"
            ),
            "{note}"
        );
    }

    #[tokio::test]
    async fn the_text_is_what_the_server_prints() {
        let pending = [write(
            1,
            "create_entities",
            json!({"entities": [{"name": "Z", "entityType": "t", "observations": []}]}),
        )];
        let args = json!({"names": ["Z"]});
        let Answer::Simulated(result) = Memory
            .simulate(
                ReadCall {
                    tool: "open_nodes",
                    args: &args,
                },
                &pending,
                &real(),
            )
            .await
        else {
            panic!()
        };
        let gatekeeper_core::Content::Text { text } = &result.content[1] else {
            panic!()
        };
        assert_eq!(
            text,
            "{\n  \"entities\": [\n    {\n      \"name\": \"Z\",\n      \"entityType\": \"t\",\n      \"observations\": []\n    }\n  ],\n  \"relations\": []\n}"
        );
        assert_eq!(result.extra["_meta"]["gate/pending"]["actions"], json!([1]));
    }

    #[tokio::test]
    async fn an_observation_of_a_pending_entity_is_built_on_it_and_a_changed_entity_is_stale() {
        let pending = [
            write(
                3,
                "create_entities",
                json!({"entities": [{"name": "Cy", "entityType": "robot", "observations": []}]}),
            ),
            write(
                4,
                "add_observations",
                json!({"observations": [{"entityName": "Cy", "contents": ["beeps"]}]}),
            ),
            write(
                5,
                "add_observations",
                json!({"observations": [{"entityName": "Ada", "contents": ["reads"]}]}),
            ),
            write(
                6,
                "delete_observations",
                json!({"deletions": [{"entityName": "Cy", "observations": ["beeps"]}]}),
            ),
        ];
        let pending = &pending;
        let basis = |i: usize, real: Real| async move {
            Memory
                .basis(&pending[i], &pending[..i], &real)
                .await
                .unwrap()
        };
        assert_eq!(basis(1, real()).await.built_on, [3]);
        assert_eq!(basis(3, real()).await.built_on, [3, 4]);
        let on_ada = basis(2, real()).await;
        assert!(on_ada.built_on.is_empty());
        assert_eq!(on_ada.targets[0].name, "entity \"Ada\"");
        assert!(basis(2, real()).await.changes_since(&on_ada).is_empty());
        // Someone added an observation to Ada outside the gate: stale.
        let mut changed = real();
        changed.0["entities"][0]["observations"] = json!(["wrote notes", "left"]);
        let now = Memory
            .basis(&pending[2], &pending[..2], &changed)
            .await
            .unwrap();
        let changes = now.changes_since(&on_ada);
        assert!(
            changes.len() == 1
                && changes[0].starts_with("entity \"Ada\" was type and observations sha256:"),
            "{changes:?}"
        );
        // Ada deleted outside the gate: stale, absent.
        let mut gone = real();
        gone.0["entities"] = json!([{"name": "Bob", "entityType": "person", "observations": []}]);
        let now = Memory
            .basis(&pending[2], &pending[..2], &gone)
            .await
            .unwrap();
        assert!(now.changes_since(&on_ada)[0].ends_with("is now absent"));
    }

    #[tokio::test]
    async fn an_unknown_write_is_not_guessed() {
        let pending = [write(2, "merge_entities", json!({}))];
        let args = json!({});
        let answer = Memory
            .simulate(
                ReadCall {
                    tool: "read_graph",
                    args: &args,
                },
                &pending,
                &real(),
            )
            .await;
        assert!(
            matches!(&answer, Answer::Cannot { reason, actions } if reason.contains("merge_entities") && actions == &[2]),
            "{answer:?}"
        );
    }
}
