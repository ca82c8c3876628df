//! The deny list ([`DenyList`]): patterns kept per field, a pattern listed
//! again taking the new reason under its id, removal by id, and the bound.
//!
//! [`DenyList`]: websub_hub::storage::events::DenyList

use websub_hub::storage::events::denials::MAX_DENIALS;
use websub_hub::storage::events::{Denial, DeniedField, EventLog};

use super::helpers::{base_time, secs};

fn denial(id: &str, field: DeniedField, pattern: &str, reason: &str, at: i64) -> Denial {
    Denial {
        id: id.to_owned(),
        field,
        pattern: pattern.to_owned(),
        reason: reason.to_owned(),
        created_at: base_time() + secs(at),
    }
}

pub async fn denials_are_kept_listed_replaced_and_removed(log: &dyn EventLog) {
    let spam = denial(
        "a1",
        DeniedField::Callback,
        "https://*.spam.example/*",
        "Zoë's \"rule\"",
        0,
    );
    let topic = denial("b2", DeniedField::Topic, "https://spam.example/*", "no", 1);
    // The same pattern for the other field is another denial.
    let same_text = denial(
        "c3",
        DeniedField::Topic,
        "https://*.spam.example/*",
        "also",
        2,
    );
    for denial in [&spam, &topic, &same_text] {
        assert_eq!(
            log.add_denial(denial).await.expect("add").as_ref(),
            Some(denial)
        );
    }
    assert_eq!(
        log.denials().await.expect("list"),
        vec![spam.clone(), topic.clone(), same_text.clone()]
    );

    // Listed again: its id and time are kept, its reason replaced.
    let again = denial(
        "d4",
        DeniedField::Callback,
        "https://*.spam.example/*",
        "new reason",
        3,
    );
    let kept = log.add_denial(&again).await.expect("add").expect("room");
    assert_eq!(kept.id, "a1");
    assert_eq!(kept.created_at, spam.created_at);
    assert_eq!(kept.reason, "new reason");
    assert_eq!(log.denials().await.expect("list").len(), 3);

    assert!(log.remove_denial("b2").await.expect("remove"));
    assert!(!log.remove_denial("b2").await.expect("remove again"));
    let ids: Vec<String> = log
        .denials()
        .await
        .expect("list")
        .into_iter()
        .map(|denial| denial.id)
        .collect();
    assert_eq!(ids, ["a1", "c3"]);
}

pub async fn the_deny_list_is_bounded(log: &dyn EventLog) {
    let count = usize::try_from(MAX_DENIALS).expect("a count");
    for n in 0..count {
        let listed = log
            .add_denial(&denial(
                &format!("id{n}"),
                DeniedField::Topic,
                &format!("https://t{n}.example/*"),
                "full",
                i64::try_from(n).expect("small"),
            ))
            .await
            .expect("add");
        assert!(listed.is_some(), "{n} of {count}");
    }
    let one_more = denial("over", DeniedField::Topic, "https://over.example/*", "r", 0);
    assert_eq!(log.add_denial(&one_more).await.expect("add"), None, "full");
    // A listed pattern still takes a new reason when the list is full.
    let again = denial(
        "x",
        DeniedField::Topic,
        "https://t0.example/*",
        "renewed",
        0,
    );
    assert_eq!(
        log.add_denial(&again)
            .await
            .expect("add")
            .map(|kept| kept.reason),
        Some("renewed".to_owned())
    );
    assert!(log.remove_denial("id7").await.expect("remove"));
    assert!(
        log.add_denial(&one_more).await.expect("add").is_some(),
        "room again"
    );
}
