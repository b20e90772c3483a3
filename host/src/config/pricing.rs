//! `[pricing."ORIGIN"]`: what the host knows of a model API it lets guests call, by origin
//! (`"https://api.openai.com"`): the wire format its calls use, so the host can read each call's
//! model and token usage (GenAI spans and metrics, token counts per dispatch). Prices per model
//! come with budgets.

use serde::Deserialize;

use super::outbound::{HostPattern, OutboundHost};

/// The wire format of a model API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// OpenAI's: Chat Completions, Responses, Completions and Embeddings (also what Ollama,
    /// vLLM, OpenRouter and most gateways speak).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl ModelFormat {
    /// The `gen_ai.provider.name` a call gets unless the origin names its own.
    pub fn provider(self) -> &'static str {
        match self {
            ModelFormat::Openai => "openai",
            ModelFormat::Anthropic => "anthropic",
        }
    }
}

/// One `[pricing."ORIGIN"]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricingConfig {
    /// The wire format: `"openai"` or `"anthropic"`.
    pub format: ModelFormat,
    /// `gen_ai.provider.name` (default: the format's, `openai` or `anthropic`): a short name of
    /// lowercase letters, digits, `.`, `-` and `_` (`"ollama"`, `"azure.ai.openai"`).
    #[serde(default)]
    pub provider: Option<String>,
}

/// A model API origin, as the outbound path matches it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOrigin {
    /// The origin, exactly (scheme, host, port).
    pub origin: OutboundHost,
    /// Its format.
    pub format: ModelFormat,
    /// Its `gen_ai.provider.name`.
    pub provider: String,
}

/// The `[pricing]` tables as origins; `Err((origin, message))` names the first table that is
/// wrong.
///
/// # Errors
///
/// An origin that is not `scheme://host[:port]` with one host and one port (no `*`), or a
/// provider name that is not short lowercase text.
pub fn origins(
    tables: &std::collections::BTreeMap<String, PricingConfig>,
) -> Result<Vec<ModelOrigin>, (String, String)> {
    tables
        .iter()
        .map(|(key, table)| {
            let origin: OutboundHost = key.parse().map_err(|e| (key.clone(), e))?;
            if matches!(origin.host, HostPattern::Any | HostPattern::Subdomains(_))
                || origin.port.is_none()
            {
                return Err((
                    key.clone(),
                    "must be one origin, scheme://host[:port], without `*`".into(),
                ));
            }
            let provider = match &table.provider {
                None => table.format.provider().to_owned(),
                Some(p) => {
                    let ok = !p.is_empty()
                        && p.len() <= 64
                        && p.bytes().all(|b| {
                            b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                        });
                    if !ok {
                        return Err((
                            key.clone(),
                            format!(
                                "provider: `{p}` is not a provider name (lowercase letters, \
                                 digits, `.`, `-` and `_`, at most 64)"
                            ),
                        ));
                    }
                    p.clone()
                }
            };
            Ok(ModelOrigin {
                origin,
                format: table.format,
                provider,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn tables(text: &str) -> std::collections::BTreeMap<String, PricingConfig> {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn origins_are_exact_and_providers_short() {
        let found = origins(&tables(
            "[\"https://api.openai.com\"]\nformat = \"openai\"\n[\"http://127.0.0.1:11434\"]\nformat = \"openai\"\nprovider = \"ollama\"\n",
        ))
        .unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].origin.to_string(), "http://127.0.0.1:11434");
        assert_eq!(found[0].provider, "ollama");
        assert_eq!(found[1].origin.to_string(), "https://api.openai.com:443");
        assert_eq!(found[1].provider, "openai");
        let (key, why) =
            origins(&tables("[\"https://*.openai.com\"]\nformat = \"openai\"\n")).unwrap_err();
        assert!(
            key.contains("*.openai.com") && why.contains("one origin"),
            "{why}"
        );
        let (_, why) = origins(&tables(
            "[\"https://a.example\"]\nformat = \"anthropic\"\nprovider = \"Big Co\"\n",
        ))
        .unwrap_err();
        assert!(why.contains("provider"), "{why}");
        assert!(
            toml::from_str::<std::collections::BTreeMap<String, PricingConfig>>(
                "[\"https://a\"]\nformat = \"gemini\"\n"
            )
            .is_err()
        );
    }
}
