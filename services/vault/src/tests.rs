//! The vault against a real SQLite database (the router's integration
//! tests run it on PostgreSQL, across replicas).

use super::*;

/// A migrated database in a file of its own; removed when dropped.
struct TempDb {
    db: Database,
    path: std::path::PathBuf,
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

async fn temp_db(name: &str) -> TempDb {
    let path = std::env::temp_dir().join(format!("sb-vault-{name}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let db = Database::connect(&format!("sqlite:{}", path.display()), Duration::from_secs(2)).unwrap();
    db.migrate().await.unwrap();
    TempDb { db, path }
}

fn vault(db: &Database, current: &str, previous: &[&str]) -> Vault {
    let keyring = Keyring::new(Key::parse(current).unwrap(), previous.iter().map(|k| Key::parse(k).unwrap()).collect());
    Vault::new(Some(db.clone()), Some(keyring), 100, &Registry::new())
}

fn bearer(tenant: &str, user: Option<&str>, upstream: &str, token: &str) -> NewCredential {
    NewCredential {
        tenant: tenant.into(),
        user: user.map(str::to_owned),
        upstream: upstream.into(),
        headers: vec![("Authorization".into(), format!("Bearer {token}"))],
    }
}

/// What a channel of `user` of `tenant` to `upstream` sends now.
fn sent(
    vault: &Vault,
    tenant: &str,
    user: Option<&str>,
    upstream: &str,
    required: bool,
) -> Result<Option<String>, String> {
    let credentials = vault.credentials(tenant, user, upstream, required);
    match credentials.current() {
        Ok(Some(c)) => Ok(Some(String::from_utf8(c.raw().to_vec()).unwrap())),
        Ok(None) => Ok(None),
        Err(Missing(why)) => Err(why),
    }
}

#[tokio::test]
async fn a_request_carries_its_users_credential_else_its_tenants_else_none() {
    let t = temp_db("lookup").await;
    let key = Key::generate();
    let v = vault(&t.db, &key, &[]);
    v.load().await.unwrap();
    v.put(bearer("acme", Some("alice"), "github", "alice-token"), 1).await.unwrap();
    v.put(bearer("acme", None, "github", "acme-token"), 2).await.unwrap();
    v.put(bearer("beta", Some("alice"), "github", "beta-alice"), 3).await.unwrap();

    assert_eq!(
        sent(&v, "acme", Some("alice"), "github", false).unwrap().unwrap(),
        "\r\nauthorization: Bearer alice-token"
    );
    assert_eq!(
        sent(&v, "acme", Some("bob"), "github", false).unwrap().unwrap(),
        "\r\nauthorization: Bearer acme-token"
    );
    assert_eq!(sent(&v, "acme", None, "github", false).unwrap().unwrap(), "\r\nauthorization: Bearer acme-token");
    // Another tenant's user of the same name has their own.
    assert_eq!(
        sent(&v, "beta", Some("alice"), "github", false).unwrap().unwrap(),
        "\r\nauthorization: Bearer beta-alice"
    );
    // Nothing for this upstream: its own headers, or the words of a refusal.
    assert_eq!(sent(&v, "acme", Some("alice"), "linear", false).unwrap(), None);
    let why = sent(&v, "beta", Some("carol"), "github", true).unwrap_err();
    assert!(
        why.contains("user \"carol\"")
            && why.contains("switchboard credentials set --tenant beta --user carol --upstream github"),
        "{why}"
    );
    assert!(!why.contains("beta-alice"));

    // A channel asks on every request: a change shows at once, a deletion too.
    let channel = v.credentials("acme", Some("alice"), "github", true);
    v.put(bearer("acme", Some("alice"), "github", "alice-new"), 4).await.unwrap();
    assert_eq!(channel.current().unwrap().unwrap().raw(), b"\r\nauthorization: Bearer alice-new");
    v.delete("acme", Some("alice"), "github").await.unwrap();
    assert_eq!(channel.current().unwrap().unwrap().raw(), b"\r\nauthorization: Bearer acme-token");
    v.delete("acme", None, "github").await.unwrap();
    assert!(channel.current().is_err());
    assert!(v.delete("acme", None, "github").await.unwrap_err().to_string().contains("not found"));
}

#[tokio::test]
async fn values_are_sealed_at_rest_and_never_listed() {
    let t = temp_db("sealed").await;
    let v = vault(&t.db, &Key::generate(), &[]);
    let row = v.put(bearer("acme", Some("alice"), "github", "ghp_s3cret"), 1).await.unwrap();
    assert_eq!(row.names, "authorization");
    let listed = v.list(Some("acme")).await.unwrap();
    assert_eq!(listed.len(), 1);
    let shown = serde_json::to_string(&listed).unwrap();
    assert!(!shown.contains("s3cret") && !shown.contains(&listed[0].sealed), "{shown}");
    assert!(shown.contains("\"user\":\"alice\"") && shown.contains("\"names\":\"authorization\""), "{shown}");
    // Nothing readable in the database file.
    drop(v);
    let bytes = std::fs::read(&t.path).unwrap();
    let wal = std::fs::read(format!("{}-wal", t.path.display())).unwrap_or_default();
    for b in [&bytes, &wal] {
        assert!(!b.windows(10).any(|w| w == b"ghp_s3cret"), "the token is in the database file");
    }
}

#[tokio::test]
async fn records_do_not_open_without_their_key_and_a_wrong_key_is_refused_at_load() {
    let t = temp_db("wrongkey").await;
    let right = Key::generate();
    let v = vault(&t.db, &right, &[]);
    v.put(bearer("acme", Some("alice"), "github", "tok"), 1).await.unwrap();

    let wrong = vault(&t.db, &Key::generate(), &[]);
    let refusal = wrong.load().await.unwrap_err().to_string();
    let right_id = Key::parse(&right).unwrap().id().to_owned();
    assert!(refusal.contains("wrong vault key") && refusal.contains(&right_id), "{refusal}");
    // Its requests fail rather than fall back to the tenant's or none.
    let why = sent(&wrong, "acme", Some("alice"), "github", false).unwrap_err();
    assert!(why.contains("cannot be read") && !why.contains(&right_id), "the client is not told key ids: {why}");

    let keyless = Vault::new(Some(t.db.clone()), None, 100, &Registry::new());
    let refusal = keyless.load().await.unwrap_err().to_string();
    assert!(refusal.contains("no vault key is configured"), "{refusal}");
    assert!(matches!(keyless.put(bearer("acme", None, "github", "x"), 1).await, Err(VaultError::NoKey)));

    vault(&t.db, &right, &[]).load().await.unwrap();
}

#[tokio::test]
async fn until_loaded_no_request_goes_with_the_upstreams_own_headers() {
    let t = temp_db("unloaded").await;
    let v = vault(&t.db, &Key::generate(), &[]);
    // As if the database had not answered yet: nothing known, nothing sent.
    let why = sent(&v, "acme", Some("alice"), "github", false).unwrap_err();
    assert!(why.contains("not loaded"), "{why}");
    v.load().await.unwrap();
    assert_eq!(sent(&v, "acme", Some("alice"), "github", false).unwrap(), None);
    // With neither a database nor a key, there is nothing to wait for.
    let none = Vault::new(None, None, 1, &Registry::new());
    assert_eq!(sent(&none, "acme", None, "github", false).unwrap(), None);
}

#[tokio::test]
async fn a_sealed_value_moved_to_another_record_does_not_open() {
    let t = temp_db("moved").await;
    let v = vault(&t.db, &Key::generate(), &[]);
    v.put(bearer("acme", Some("alice"), "github", "alice"), 1).await.unwrap();
    v.put(bearer("acme", Some("mallory"), "github", "mallory"), 1).await.unwrap();
    let rows = v.list(None).await.unwrap();
    let alice = rows.iter().find(|r| r.user_id == "alice").unwrap();
    // Someone with write access to the database gives mallory alice's token.
    let mut stolen = rows.iter().find(|r| r.user_id == "mallory").unwrap().clone();
    stolen.sealed = alice.sealed.clone();
    t.db.put_credential(&stolen).await.unwrap();
    let refusal = v.load().await.unwrap_err().to_string();
    assert!(refusal.contains("altered or corrupted") && refusal.contains("acme/mallory/github"), "{refusal}");
    assert!(sent(&v, "acme", Some("mallory"), "github", false).is_err());
    assert!(sent(&v, "acme", Some("alice"), "github", false).unwrap().unwrap().contains("Bearer alice"));
}

#[tokio::test]
async fn a_rotation_reseals_every_record_with_the_new_key() {
    let t = temp_db("rotate").await;
    let (old, new) = (Key::generate(), Key::generate());
    let before = vault(&t.db, &old, &[]);
    for user in ["alice", "bob", "carol"] {
        before.put(bearer("acme", Some(user), "github", &format!("{user}-token")), 1).await.unwrap();
    }
    let old_sealed: Vec<String> = before.list(None).await.unwrap().into_iter().map(|r| r.sealed).collect();

    // Step 1: the new key current, the old one kept to open what it sealed.
    let during = vault(&t.db, &new, &[&old]);
    during.load().await.unwrap();
    during.put(bearer("acme", Some("dave"), "github", "dave-token"), 2).await.unwrap();
    let rotation = during.rotate().await.unwrap();
    assert_eq!(rotation, Rotation { resealed: 3, current: 1 });
    let new_id = Key::parse(&new).unwrap().id().to_owned();
    let rows = during.list(None).await.unwrap();
    assert!(rows.iter().all(|r| r.key_id == new_id));
    assert!(rows.iter().all(|r| !old_sealed.contains(&r.sealed)));
    assert_eq!(during.rotate().await.unwrap(), Rotation { resealed: 0, current: 4 });

    // Step 2: the old key gone; everything still opens, with the new key only.
    let after = vault(&t.db, &new, &[]);
    after.load().await.unwrap();
    for user in ["alice", "bob", "carol", "dave"] {
        let sent = sent(&after, "acme", Some(user), "github", true).unwrap().unwrap();
        assert!(sent.ends_with(&format!("Bearer {user}-token")), "{sent}");
    }
    assert!(vault(&t.db, &old, &[]).load().await.is_err());
    // A rotation that cannot open a record changes nothing.
    let lost = vault(&t.db, &Key::generate(), &[]);
    assert!(matches!(lost.rotate().await, Err(VaultError::Unreadable(_))));
    assert!(lost.list(None).await.unwrap().iter().all(|r| r.key_id == new_id));
}

#[tokio::test]
async fn bad_credentials_and_too_many_are_refused() {
    let t = temp_db("bad").await;
    let keyring = Keyring::new(Key::parse(&Key::generate()).unwrap(), Vec::new());
    let v = Vault::new(Some(t.db.clone()), Some(keyring), 2, &Registry::new());
    let refused = |new: NewCredential| {
        let v = v.clone();
        async move { v.put(new, 1).await.unwrap_err().to_string() }
    };
    let mut c = bearer("acme", None, "github", "x");
    c.headers = vec![("Host".into(), "evil".into())];
    assert!(refused(c.clone()).await.contains("set by the router"));
    c.headers = vec![("X-A".into(), "a\r\nX-Injected: 1".into())];
    assert!(refused(c.clone()).await.contains("not a valid header value"));
    c.headers = vec![];
    assert!(refused(c.clone()).await.contains("1 to 16 headers"));
    c.headers = vec![("X-Big".into(), "v".repeat(MAX_CREDENTIAL_BYTES))];
    assert!(refused(c.clone()).await.contains("bytes"));
    c.headers = vec![("X-A".into(), "1".into()), ("x-a".into(), "2".into())];
    assert!(refused(c.clone()).await.contains("twice"));
    assert!(refused(bearer("acme", Some(""), "github", "x")).await.contains("a user is"));

    v.put(bearer("acme", Some("a"), "github", "x"), 1).await.unwrap();
    v.put(bearer("acme", Some("b"), "github", "x"), 1).await.unwrap();
    assert!(refused(bearer("acme", Some("c"), "github", "x")).await.contains("vault.max_per_tenant"));
    // Replacing one is not one more; another tenant has its own count.
    v.put(bearer("acme", Some("b"), "github", "y"), 2).await.unwrap();
    v.put(bearer("beta", Some("c"), "github", "x"), 1).await.unwrap();
    assert_eq!(v.list(Some("acme")).await.unwrap().len(), 2);
}

#[test]
fn an_authorization_state_opens_only_as_sealed_and_only_with_a_configured_key() {
    let key = keys::Key::generate();
    let keyring = keys::Keyring::new(keys::Key::parse(&key).unwrap(), Vec::new());
    let vault = Vault::new(None, Some(keyring), 10, &Registry::new());
    let sealed = vault.seal_state(b"{\"t\":\"acme\"}").expect("a key is configured");
    assert!(sealed.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)), "URL-safe: {sealed}");
    assert_eq!(vault.open_state(&sealed).as_deref(), Some(&b"{\"t\":\"acme\"}"[..]));
    // One character changed: refused.
    let mut tampered = sealed.clone().into_bytes();
    let last = tampered.len() - 2;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    assert_eq!(vault.open_state(std::str::from_utf8(&tampered).unwrap()), None);
    // Another vault's key: refused.
    let other = keys::Keyring::new(keys::Key::parse(&keys::Key::generate()).unwrap(), Vec::new());
    assert_eq!(Vault::new(None, Some(other), 10, &Registry::new()).open_state(&sealed), None);
    // No key: nothing sealed.
    assert_eq!(Vault::new(None, None, 10, &Registry::new()).seal_state(b"x"), None);
}
