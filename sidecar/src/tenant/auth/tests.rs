use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::authentication::v1::UserInfo;

use super::*;

const AUD: &str = "orchestrator.io/mcp-proxy";

/// Answers each review from `answer(token)` after `delay`, counting reviews.
struct Fake {
    reviews: AtomicUsize,
    delay: Duration,
    answer: fn(&str) -> anyhow::Result<TokenReviewStatus>,
}

impl Reviewer for Arc<Fake> {
    fn review(
        &self,
        token: String,
        audience: String,
    ) -> BoxFuture<'static, anyhow::Result<TokenReviewStatus>> {
        assert_eq!(audience, AUD);
        self.reviews.fetch_add(1, Ordering::SeqCst);
        let (delay, answer) = (self.delay, self.answer);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer(&token)
        })
    }
}

fn fake(answer: fn(&str) -> anyhow::Result<TokenReviewStatus>) -> Arc<Fake> {
    Arc::new(Fake {
        reviews: AtomicUsize::new(0),
        delay: Duration::from_millis(20),
        answer,
    })
}

/// A clock the test moves by hand.
#[derive(Clone)]
struct Hand(Arc<Mutex<Instant>>);

impl Hand {
    fn advance(&self, by: Duration) {
        *lock(&self.0) += by;
    }
}

fn auth_at(fake: &Arc<Fake>, max: usize) -> (Arc<Authenticator>, Hand) {
    let hand = Hand(Arc::new(Mutex::new(Instant::now())));
    let clock = hand.clone();
    let auth = Authenticator::with_clock(
        Arc::new(fake.clone()),
        AUD.into(),
        max,
        Arc::new(move || *lock(&clock.0)),
    );
    (auth, hand)
}

fn auth(fake: &Arc<Fake>, max: usize) -> Arc<Authenticator> {
    auth_at(fake, max).0
}

fn reviews(fake: &Arc<Fake>) -> usize {
    fake.reviews.load(Ordering::SeqCst)
}

fn b64url(bytes: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// A JWT-shaped token expiring in `secs` (negative: expired), distinct per `tag`.
fn token(tag: &str, secs: i64) -> String {
    let exp = now().saturating_add_signed(secs);
    let payload = serde_json::json!({"exp": exp, "sub": tag});
    format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.sig-{tag}",
        b64url(payload.to_string().as_bytes())
    )
}

fn header(token: &str) -> String {
    format!("Bearer {token}")
}

fn bound(pod_uid: &str) -> TokenReviewStatus {
    let mut extra = BTreeMap::new();
    extra.insert(POD_UID_EXTRA.to_string(), vec![pod_uid.to_string()]);
    extra.insert(POD_NAME_EXTRA.to_string(), vec!["task-a-x7k2p".to_string()]);
    TokenReviewStatus {
        authenticated: Some(true),
        audiences: Some(vec![AUD.into()]),
        user: Some(UserInfo {
            username: Some("system:serviceaccount:team-a:default".into()),
            extra: Some(extra),
            ..Default::default()
        }),
        error: None,
    }
}

/// Every token whose signature part says "good" is pod-bound to uid "u-<sub>"; others are
/// refused as the API server refuses them.
fn by_tag(token: &str) -> anyhow::Result<TokenReviewStatus> {
    let tag = token.rsplit("sig-").next().unwrap_or_default();
    Ok(match tag {
        t if t.starts_with("good") => bound(&format!("u-{t}")),
        "unbound" => {
            let mut s = bound("x");
            s.user.as_mut().expect("user").extra = None;
            s
        }
        "audience" => TokenReviewStatus {
            audiences: Some(vec!["https://kubernetes.default.svc".into()]),
            ..bound("x")
        },
        "user" => {
            let mut s = bound("x");
            s.user.as_mut().expect("user").username = Some("alice".into());
            s
        }
        "down" => anyhow::bail!("connection refused"),
        _ => TokenReviewStatus {
            authenticated: Some(false),
            error: Some("invalid bearer token".into()),
            ..Default::default()
        },
    })
}

fn invalid(v: &Verdict) -> bool {
    matches!(v, Err(Refused::Invalid(_)))
}

#[tokio::test]
async fn a_pod_bound_token_is_reviewed_once_and_cached_until_its_exp() {
    let fake = fake(by_tag);
    let (auth, clock) = auth_at(&fake, MAX_ENTRIES);
    let t = token("good-a", 60);
    let identity = auth
        .authenticate(Some(&header(&t)))
        .await
        .expect("accepted");
    assert_eq!(identity.pod_uid, "u-good-a");
    assert_eq!(identity.pod_name, "task-a-x7k2p");
    assert_eq!(identity.username, "system:serviceaccount:team-a:default");
    for _ in 0..5 {
        auth.authenticate(Some(&header(&t)))
            .await
            .expect("accepted");
    }
    assert_eq!(reviews(&fake), 1);
    // Past its exp the cached answer is not used (the wall clock does not move in this test, so
    // the early exp check passes and the API server is asked again).
    clock.advance(Duration::from_secs(61));
    auth.authenticate(Some(&header(&t)))
        .await
        .expect("accepted");
    assert_eq!(reviews(&fake), 2);
}

#[tokio::test]
async fn a_refused_token_is_refused_from_the_cache_for_five_seconds() {
    let fake = fake(by_tag);
    let (auth, clock) = auth_at(&fake, MAX_ENTRIES);
    let t = token("forged", 600);
    for _ in 0..10 {
        assert!(invalid(&auth.authenticate(Some(&header(&t))).await));
    }
    assert_eq!(reviews(&fake), 1);
    clock.advance(FAILURE_TTL + Duration::from_millis(1));
    assert!(invalid(&auth.authenticate(Some(&header(&t))).await));
    assert_eq!(reviews(&fake), 2);
}

#[tokio::test]
async fn concurrent_requests_with_one_token_wait_for_one_review() {
    let fake = fake(by_tag);
    let auth = auth(&fake, MAX_ENTRIES);
    let t = token("good-b", 600);
    let waits: Vec<_> = (0..20)
        .map(|_| {
            let (auth, h) = (auth.clone(), header(&t));
            tokio::spawn(async move { auth.authenticate(Some(&h)).await })
        })
        .collect();
    for wait in waits {
        assert_eq!(
            wait.await.expect("joined").expect("accepted").pod_uid,
            "u-good-b"
        );
    }
    assert_eq!(reviews(&fake), 1);
    // Two tokens are two reviews, also at once.
    let (a, b) = (token("good-c", 600), token("good-d", 600));
    let (ha, hb) = (header(&a), header(&b));
    let (ra, rb) = tokio::join!(auth.authenticate(Some(&ha)), auth.authenticate(Some(&hb)));
    assert_eq!(
        (
            ra.expect("a").pod_uid.as_str(),
            rb.expect("b").pod_uid.as_str()
        ),
        ("u-good-c", "u-good-d")
    );
    assert_eq!(reviews(&fake), 3);
}

#[tokio::test]
async fn only_an_authenticated_service_account_token_bound_to_a_pod_for_our_audience_passes() {
    let fake = fake(by_tag);
    let auth = auth(&fake, MAX_ENTRIES);
    // One token each, made once: a token made again a second later is another token.
    let unbound = token("unbound", 600);
    let refused = [
        unbound.clone(),
        token("audience", 600),
        token("user", 600),
        token("forged", 600),
    ];
    for t in &refused {
        let verdict = auth.authenticate(Some(&header(t))).await;
        assert!(invalid(&verdict), "{t}: {verdict:?}");
    }
    assert_eq!(reviews(&fake), 4);
    // From the cache (the same token): why it was refused.
    let Err(Refused::Invalid(why)) = auth.authenticate(Some(&header(&unbound))).await else {
        panic!("the unbound token passed");
    };
    assert!(why.contains("not bound to a pod"), "{why}");
    // Refused without asking the API server: no header, another scheme, not a JWT, expired.
    for h in [
        None,
        Some("Basic dTpw".to_string()),
        Some("Bearer".to_string()),
        Some("Bearer not-a-jwt".to_string()),
        Some("Bearer a.!!!.c".to_string()),
        Some(header(&token("good-e", -1))),
    ] {
        assert!(invalid(&auth.authenticate(h.as_deref()).await), "{h:?}");
    }
    assert_eq!(reviews(&fake), 4);
}

#[tokio::test]
async fn an_api_server_that_cannot_answer_is_unavailable_and_asked_again_next_time() {
    let fake = fake(by_tag);
    let auth = auth(&fake, MAX_ENTRIES);
    let t = token("down", 600);
    for round in 1..=2 {
        assert!(matches!(
            auth.authenticate(Some(&header(&t))).await,
            Err(Refused::Unavailable(_))
        ));
        assert_eq!(reviews(&fake), round);
    }
}

#[tokio::test]
async fn the_cache_is_bounded_and_evicts_the_oldest_first() {
    let fake = fake(by_tag);
    let auth = auth(&fake, 2);
    let tokens: Vec<String> = ["good-1", "good-2", "good-3"]
        .iter()
        .map(|t| token(t, 600))
        .collect();
    for t in &tokens {
        auth.authenticate(Some(&header(t))).await.expect("accepted");
    }
    assert_eq!((reviews(&fake), auth.len()), (3, 2));
    // The newest two are cached; the first was evicted and is reviewed again.
    auth.authenticate(Some(&header(&tokens[2])))
        .await
        .expect("accepted");
    auth.authenticate(Some(&header(&tokens[1])))
        .await
        .expect("accepted");
    assert_eq!(reviews(&fake), 3);
    auth.authenticate(Some(&header(&tokens[0])))
        .await
        .expect("accepted");
    assert_eq!((reviews(&fake), auth.len()), (4, 2));
}

#[test]
fn base64url_decodes_what_jwts_use() {
    assert_eq!(
        base64url("eyJleHAiOjF9").as_deref(),
        Some(&br#"{"exp":1}"#[..])
    );
    assert_eq!(
        base64url(&b64url(b"\xff\xfe\xfd?")).as_deref(),
        Some(&b"\xff\xfe\xfd?"[..])
    );
    assert_eq!(base64url("a+b"), None);
}
