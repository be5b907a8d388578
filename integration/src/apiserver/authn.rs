//! Authentication: static bearer tokens, like kube-apiserver's
//! `--token-auth-file`. Every authenticated user is in
//! `system:authenticated`; a ServiceAccount user
//! (`system:serviceaccount:NS:NAME`) is also in `system:serviceaccounts`
//! and `system:serviceaccounts:NS`.

use std::collections::HashMap;

use axum::http::{header, HeaderMap};

/// Group whose members bypass authorization.
pub const MASTERS: &str = "system:masters";

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The user with the groups kube-apiserver adds.
    pub fn new(name: &str, groups: &[String]) -> UserInfo {
        let mut all: Vec<String> = groups.to_vec();
        let mut add = |g: String| {
            if !all.contains(&g) {
                all.push(g);
            }
        };
        if let Some((ns, _)) = service_account(name) {
            add("system:serviceaccounts".into());
            add(format!("system:serviceaccounts:{ns}"));
        }
        add("system:authenticated".into());
        UserInfo {
            name: name.to_string(),
            groups: all,
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}

/// `(namespace, name)` of a ServiceAccount user name.
pub fn service_account(user: &str) -> Option<(&str, &str)> {
    user.strip_prefix("system:serviceaccount:")?.split_once(':')
}

/// Token → user.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tokens: HashMap<String, UserInfo>,
}

impl Authenticator {
    /// From `(token, user, groups)` triples.
    pub fn new(tokens: &[(String, String, Vec<String>)]) -> Authenticator {
        Authenticator {
            tokens: tokens
                .iter()
                .map(|(t, u, g)| (t.clone(), UserInfo::new(u, g)))
                .collect(),
        }
    }

    /// The user of the request's `Authorization: Bearer` token; `None` when
    /// missing or unknown (401).
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<&UserInfo> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.tokens.get(token.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_groups_are_added() {
        let u = UserInfo::new("system:serviceaccount:nodelb-system:nodelb", &[]);
        assert_eq!(
            u.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:nodelb-system",
                "system:authenticated"
            ]
        );
        assert!(!u.is_master());
        assert!(UserInfo::new("admin", &[MASTERS.into()]).is_master());
    }

    #[test]
    fn bearer_tokens() {
        let a = Authenticator::new(&[("t1".into(), "alice".into(), vec![])]);
        let mut h = HeaderMap::new();
        assert!(a.authenticate(&h).is_none());
        h.insert(header::AUTHORIZATION, "Bearer t1".parse().unwrap());
        assert_eq!(a.authenticate(&h).unwrap().name, "alice");
        h.insert(header::AUTHORIZATION, "Bearer t2".parse().unwrap());
        assert!(a.authenticate(&h).is_none());
    }
}
