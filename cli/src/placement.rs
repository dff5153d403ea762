//! `task submit --node-selector` and `--toleration`: where the task's pod may run
//! (`spec.podTemplate`), parsed from their flags.

/// `--node-selector KEY=VALUE`.
pub fn parse_node_selector(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?}: expected KEY=VALUE (a node label)")),
    }
}

/// `--toleration KEY[=VALUE][:EFFECT]`: with a value, operator Equal; without, Exists.
pub fn parse_toleration(text: &str) -> Result<k8s_openapi::api::core::v1::Toleration, String> {
    const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
    let (rest, effect) = match text.rsplit_once(':') {
        Some((rest, effect)) if EFFECTS.contains(&effect) => (rest, Some(effect.to_string())),
        Some((_, effect)) => {
            return Err(format!(
                "{text:?}: the effect {effect:?} is not one of {}",
                EFFECTS.join(", ")
            ));
        }
        None => (text, None),
    };
    let (key, value) = match rest.split_once('=') {
        Some((key, value)) => (key, Some(value.to_string())),
        None => (rest, None),
    };
    if key.is_empty() {
        return Err(format!(
            "{text:?}: expected KEY[=VALUE][:EFFECT] (a taint's key first)"
        ));
    }
    Ok(k8s_openapi::api::core::v1::Toleration {
        key: Some(key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value,
        effect,
        ..Default::default()
    })
}
