//! nodelb's `events.k8s.io/v1` Events, Node and Service ones alike: what each shares ([`new_event`]):
//! its name (`<object>.<hex unique suffix>`, always a valid one), the server's length limits,
//! and creating it ([`create_event`]). Which Events are due is decided by their callers
//! (`node_events` for this node's problems, the status writer for Services).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::Client;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::debug;

pub const REPORTING_CONTROLLER: &str = "nodelb.io/nodelb";

/// Where Events about a cluster-scoped object (a Node) go: the server takes them in `default`
/// (or `kube-system`) only.
const CLUSTER_SCOPED_EVENTS_NAMESPACE: &str = "default";

/// kube-apiserver's limits (`pkg/apis/core/validation/events.go`), in bytes.
const MAX_NAME: usize = 253;
const MAX_NOTE: usize = 1024;
const MAX_REPORTING_INSTANCE: usize = 128;

/// The name of a new Event about the object named `regarding`: `<regarding>.<suffix>`, the
/// suffix being `nanos` (the Unix time in nanoseconds, as client-go names Events) in 16 hex
/// digits followed by `seq` in hex, so two Events of one process in the same nanosecond differ.
///
/// Always a DNS subdomain of at most 253 characters, as the server requires of
/// `metadata.name`: a `regarding` too long is cut to fit (and whatever the cut leaves at its
/// end that cannot end a label is dropped); one that is not a DNS subdomain is replaced by
/// `nodelb`. (A `generateName` of `<regarding>.` is refused: it ends in a dot.)
pub fn event_name(regarding: &str, nanos: u64, seq: u64) -> String {
    let suffix = format!("{nanos:016x}{seq:x}");
    let room = MAX_NAME - 1 - suffix.len();
    let cut = regarding
        .get(..room.min(regarding.len()))
        .unwrap_or_default()
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    let prefix = if is_dns_subdomain(cut) { cut } else { "nodelb" };
    format!("{prefix}.{suffix}")
}

/// [`event_name`] with the current time and this process's next sequence number.
pub fn new_event_name(regarding: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = u64::try_from(Timestamp::now().as_nanosecond()).unwrap_or(0);
    event_name(regarding, nanos, SEQ.fetch_add(1, Ordering::Relaxed))
}

/// A lowercase RFC 1123 subdomain (dot-separated labels of `[a-z0-9-]`, each starting and
/// ending with an alphanumeric), at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn cut_to(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A new `events.k8s.io/v1` Event about `regarding` (named after it, see [`event_name`]),
/// reported by nodelb's `instance`, within the server's limits (a longer note or instance is
/// cut). It goes in `regarding`'s namespace, or `default` for a cluster-scoped object.
pub fn new_event(
    regarding: ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
    instance: &str,
) -> Event {
    let name = new_event_name(regarding.name.as_deref().unwrap_or_default());
    let namespace = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| CLUSTER_SCOPED_EVENTS_NAMESPACE.into());
    Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..Default::default()
        },
        event_time: Some(MicroTime(Timestamp::now())),
        type_: Some(
            match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        reason: Some(reason.into()),
        note: Some(cut_to(note, MAX_NOTE)),
        action: Some("Program".into()),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(cut_to(instance, MAX_REPORTING_INSTANCE)),
        regarding: Some(regarding),
        ..Default::default()
    }
}

/// Creates `ev` in its namespace.
pub async fn create_event(client: Client, ev: &Event) -> Result<(), kube::Error> {
    let ns = ev.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client, ns);
    api.create(&PostParams::default(), ev).await?;
    debug!(
        namespace = ns,
        name = ev.metadata.name.as_deref().unwrap_or_default(),
        reason = ev.reason.as_deref().unwrap_or_default(),
        "Event created"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn event_name_is_the_object_and_a_hex_suffix() {
        assert_eq!(event_name("web", 0x1a2b, 0), "web.0000000000001a2b0");
        assert_eq!(event_name("web", u64::MAX, 0x1f), "web.ffffffffffffffff1f");
    }

    #[test]
    fn event_name_of_a_63_character_service_is_valid() {
        let svc = format!("s{}", "-a".repeat(31)); // 63 characters, a DNS-1035 label
        assert_eq!(svc.len(), 63);
        let name = event_name(&svc, u64::MAX, u64::MAX);
        assert!(name.starts_with(&format!("{svc}.")), "{name}");
        assert!(is_dns_subdomain(&name), "{name}");
        assert!(name.len() <= MAX_NAME);
    }

    #[test]
    fn event_name_of_a_long_node_is_cut_to_a_valid_name() {
        // Node names of every length up to 253, with '-' and '.' everywhere a cut may fall,
        // and one of 63-character labels.
        let mut nodes: Vec<String> = (1..=253)
            .map(|len| {
                "a-b.c-d.".repeat(40)[..len]
                    .trim_end_matches(['-', '.'])
                    .to_string()
            })
            .collect();
        nodes.push(format!(
            "{}.{}",
            vec!["n".repeat(63); 3].join("."),
            "m".repeat(61)
        ));
        for node in &nodes {
            assert!(
                is_dns_subdomain(node),
                "the fixture {node} is a valid Node name"
            );
            for (nanos, seq) in [(0, 0), (u64::MAX, u64::MAX), (7, 1 << 40)] {
                let name = event_name(node, nanos, seq);
                assert!(name.len() <= MAX_NAME, "{} characters: {name}", name.len());
                assert!(is_dns_subdomain(&name), "{name}");
                let (prefix, _) = name.rsplit_once('.').unwrap();
                assert!(
                    node.starts_with(prefix) && !prefix.is_empty(),
                    "{node} -> {name}"
                );
            }
        }
        assert_eq!(nodes.last().unwrap().len(), 253);
    }

    #[test]
    fn event_name_of_something_invalid_is_nodelb() {
        for bad in ["", "Web", "-x", "a..b", "é", "a_b"] {
            let name = event_name(bad, 1, 2);
            assert!(name.starts_with("nodelb."), "{bad:?} -> {name}");
            assert!(is_dns_subdomain(&name), "{name}");
        }
    }

    #[test]
    fn event_names_are_unique_across_calls() {
        let names: BTreeSet<String> = (0..10_000).map(|_| new_event_name("web")).collect();
        assert_eq!(names.len(), 10_000);
        assert!(names.iter().all(|n| is_dns_subdomain(n)));
        // The same nanosecond still gives distinct names.
        assert_ne!(event_name("web", 5, 1), event_name("web", 5, 2));
        // And fixed-width nanos keep (nanos, seq) pairs apart: (0x10, 0x1) vs (0x1, 0x01).
        assert_ne!(event_name("web", 0x10, 0x1), event_name("web", 0x1, 0x1));
    }

    #[test]
    fn notes_and_instances_fit_the_server_limits() {
        let ev = new_event(
            ObjectReference {
                kind: Some("Node".into()),
                name: Some("n1".into()),
                ..Default::default()
            },
            EventType::Warning,
            "ForwardingOff",
            &"é".repeat(1000), // 2,000 bytes
            &"p".repeat(300),
        );
        let note = ev.note.unwrap();
        assert!(
            note.len() <= MAX_NOTE && note.len() >= MAX_NOTE - 1,
            "{}",
            note.len()
        );
        assert!(note.chars().all(|c| c == 'é'));
        assert_eq!(ev.reporting_instance.unwrap().len(), MAX_REPORTING_INSTANCE);
        assert_eq!(
            ev.metadata.namespace.as_deref(),
            Some("default"),
            "a Node's Events"
        );
        assert!(ev.metadata.name.unwrap().starts_with("n1."));
        assert!(ev.metadata.generate_name.is_none());
        assert_eq!(
            ev.reporting_controller.as_deref(),
            Some(REPORTING_CONTROLLER)
        );
    }

    #[test]
    fn a_namespaced_objects_events_go_to_its_namespace() {
        let ev = new_event(
            ObjectReference {
                kind: Some("Service".into()),
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            EventType::Normal,
            "EnsuredLoadBalancer",
            "Ensured load balancer: 192.0.2.1",
            "nodelb-agent-x",
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
    }
}
