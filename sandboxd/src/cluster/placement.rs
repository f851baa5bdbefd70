//! Where a claim goes, decided from the members' records alone (pure, unit-tested): this
//! node when it has a warm guest for the template and size, else the member with the most
//! warm guests for it (the lighter loaded on a tie), else the least loaded member that
//! can start one. Drained members, members without the template or size, and full
//! members are never chosen.

use api::cluster::NodeRecord;

fn serves(n: &NodeRecord, template: &str, size: &str) -> bool {
    !n.draining
        && n.claims < n.max_claims
        && n.templates.iter().any(|t| t == template)
        && n.sizes.iter().any(|s| s == size)
}

fn warm(n: &NodeRecord, template: &str, size: &str) -> u32 {
    n.pools
        .iter()
        .filter(|p| p.template == template && p.size == size)
        .map(|p| p.warm)
        .sum()
}

/// Claims held per claim allowed: comparable across nodes of different sizes.
fn load(n: &NodeRecord) -> f64 {
    f64::from(n.claims) / f64::from(n.max_claims.max(1))
}

/// The member a claim for `template`/`size` goes to, by name; `None` when no member can
/// take it. `me` is this node's name (its own record is among `members`).
pub fn choose<'a>(
    me: &str,
    members: &'a [NodeRecord],
    template: &str,
    size: &str,
) -> Option<&'a NodeRecord> {
    let eligible: Vec<&NodeRecord> = members
        .iter()
        .filter(|n| serves(n, template, size))
        .collect();
    if let Some(local) = eligible
        .iter()
        .find(|n| n.name == me && warm(n, template, size) > 0)
    {
        return Some(local);
    }
    let by_load = |a: &&NodeRecord, b: &&NodeRecord| {
        load(a)
            .total_cmp(&load(b))
            .then_with(|| a.name.cmp(&b.name))
    };
    let warmest = eligible
        .iter()
        .filter(|n| warm(n, template, size) > 0)
        .min_by(|a, b| {
            warm(b, template, size)
                .cmp(&warm(a, template, size))
                .then_with(|| by_load(a, b))
        });
    warmest
        .or_else(|| eligible.iter().min_by(|a, b| by_load(a, b)))
        .copied()
}

#[cfg(test)]
mod tests {
    use api::cluster::NodePool;

    use super::*;

    fn node(name: &str, warm: u32, claims: u32) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            url: format!("http://{name}:1"),
            engine: "process".into(),
            templates: vec!["t".into()],
            sizes: vec!["s".into()],
            pools: vec![NodePool {
                template: "t".into(),
                size: "s".into(),
                warm,
            }],
            claims,
            max_claims: 10,
            draining: false,
        }
    }

    fn pick(me: &str, members: &[NodeRecord]) -> Option<String> {
        choose(me, members, "t", "s").map(|n| n.name.clone())
    }

    #[test]
    fn local_warm_first_then_most_warm_then_least_loaded() {
        let m = [node("a", 1, 9), node("b", 3, 0), node("c", 0, 0)];
        assert_eq!(pick("a", &m).as_deref(), Some("a"));
        let m = [node("a", 0, 0), node("b", 1, 5), node("c", 2, 8)];
        assert_eq!(pick("a", &m).as_deref(), Some("c"));
        // Equal warmth: the lighter loaded.
        let m = [node("a", 0, 0), node("b", 1, 5), node("c", 1, 2)];
        assert_eq!(pick("a", &m).as_deref(), Some("c"));
        // Nobody warm: the least loaded, this node included.
        let m = [node("a", 0, 3), node("b", 0, 1), node("c", 0, 2)];
        assert_eq!(pick("a", &m).as_deref(), Some("b"));
    }

    #[test]
    fn drained_full_and_foreign_nodes_are_never_chosen() {
        let mut drained = node("b", 5, 0);
        drained.draining = true;
        let full = node("c", 5, 10);
        let mut other = node("d", 5, 0);
        other.templates = vec!["x".into()];
        let mut me = node("a", 5, 0);
        me.draining = true;
        assert_eq!(pick("a", &[me, drained, full, other]), None);
        assert_eq!(choose("a", &[node("a", 1, 0)], "t", "other-size"), None);
    }
}
