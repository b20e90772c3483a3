//! The commands that check rather than run: `homing config check` (the config, its plugins
//! and, on NATS, the server and stream) and `homing plugin inspect`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

// The server's own reading of its tokens, so `config check` refuses what `run` would.
use crate::api::ApiServer;
use crate::config::{Config, StoreConfig};
use crate::runtime::{Runtime, WasmContext, detect_contract, detect_world};
use crate::store::nats::{NatsConfig, NatsStore};

/// `homing config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Checks a config file and compiles each plugin.
    Check {
        /// The file (default: `--config`).
        file: Option<PathBuf>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `homing plugin mcp-tools`.
pub(super) async fn mcp_tools(
    file: &Path,
    plugin: &str,
    server: &str,
    json: bool,
) -> anyhow::Result<()> {
    use crate::runtime::host::{LogState, Secrets};
    let config = Config::load(file)?;
    let Some(plugin_config) = config.plugins.get(plugin) else {
        anyhow::bail!("[plugins.{plugin}]: no such plugin");
    };
    let values = config.resolve_values(plugin)?;
    let outbound = std::sync::Arc::new(crate::runtime::outbound::Outbound::new(
        plugin,
        plugin_config,
        &config.tls_ca_files(plugin),
        &config.host.hosts,
    )?);
    let broker =
        crate::runtime::mcp::McpBroker::new(plugin, plugin_config, &values, outbound.policy());
    let log = std::sync::Arc::new(std::sync::Mutex::new(LogState {
        secrets: std::sync::Arc::new(Secrets::new(values.secrets())),
        ..LogState::default()
    }));
    let hooks = outbound.hooks(log);
    let list = broker
        .list(&hooks, server)
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let config = broker
        .config(server)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let pinned = match &config.pin {
        None => "not pinned",
        Some(pin) if *pin == list.digest => "matches the pin",
        Some(_) => "does NOT match the pin: calls are refused",
    };
    if json {
        let tools: Vec<serde_json::Value> = list
            .tools
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "description": t.description,
                    "needs_approval": t.needs_approval(config.rule_for(&t.name)),
                    "read_only": t.read_only,
                    "destructive": t.destructive,
                    "idempotent": t.idempotent,
                    "open_world": t.open_world,
                })
            })
            .collect();
        let out = serde_json::json!({ "digest": list.digest, "pinned": config.pin.as_deref() == Some(list.digest.as_str()), "tools": tools });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for t in &list.tools {
        let approval = if t.needs_approval(config.rule_for(&t.name)) {
            "approval"
        } else {
            "no approval"
        };
        println!(
            "{}\t{approval}\t{}",
            t.name,
            crate::runtime::host::escape_log_text(t.description.as_deref().unwrap_or(""))
        );
    }
    println!("digest {} ({pinned})", list.digest);
    Ok(())
}

/// `homing plugin ...`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Shows a component's world, imports and exports.
    Inspect {
        /// The `.wasm` file.
        file: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Lists the tools of a plugin's MCP server (`[plugins.PLUGIN.mcp.SERVER]`) that its
    /// `tools` allow, as the host reaches them (its egress policy, its credentials), and the
    /// digest to `pin`.
    McpTools {
        /// The plugin.
        plugin: String,
        /// The server's name.
        server: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn check(file: &Path, json: bool) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    // The schedules' times, checked by the store's rules (the config checked the rest).
    let schedules = crate::work::schedules::defs_of(
        &config,
        crate::store::Clock::now_ms(&crate::store::SystemClock),
    )
    .map_err(anyhow::Error::msg)?;
    let runtime = Runtime::new(&config)?;
    let mut plugins = BTreeMap::new();
    let mut contracts = BTreeMap::new();
    let mut values = BTreeMap::new();
    for (name, plugin) in &config.plugins {
        let path = config.resolve(&plugin.path);
        let (world, contract) = runtime.check_plugin(
            name,
            plugin,
            &path,
            &config.tls_ca_files(name),
            &config.host.hosts,
        )?;
        config.resolve_values(name)?;
        plugins.insert(name.clone(), world.name());
        contracts.insert(name.clone(), contract.name());
        // What each value is and where it comes from; never a value.
        let described: Vec<String> = plugin
            .variables
            .iter()
            .map(|(k, spec)| {
                let kind = if spec.is_secret() {
                    "secret"
                } else {
                    "variable"
                };
                format!("{kind} {k} from {}", spec.origin())
            })
            .collect();
        values.insert(name.clone(), described);
    }
    let tokens = ApiServer::check_tokens(&config)?;
    let traces = config
        .telemetry
        .traces_url()
        .map_err(anyhow::Error::msg)?
        .map(|(url, origin)| {
            // The headers by name and source only; reading them checks they are there.
            let names: Vec<String> = config
                .telemetry
                .headers
                .iter()
                .map(|(name, spec)| format!("{name} from {}", spec.origin()))
                .collect();
            if names.is_empty() {
                format!("{url} (from {origin})")
            } else {
                format!("{url} (from {origin}; headers: {})", names.join(", "))
            }
        });
    config
        .telemetry
        .read_headers(&config.base_dir)
        .map_err(anyhow::Error::msg)?;
    let store = match &config.store {
        StoreConfig::Embedded(settings) => {
            format!("embedded ({})", config.embedded_path(settings).display())
        }
        StoreConfig::Nats(settings) => {
            let nats = NatsConfig::from_settings(settings, |p| config.resolve(p));
            let report = NatsStore::check(&nats).await.with_context(|| {
                format!(
                    "checking the NATS store at {}",
                    crate::config::shown_nats_urls(&nats.urls)
                )
            })?;
            let mut line = format!(
                "nats (server {}, stream `{}` {}, {} messages, {} replica(s), max_payload {} \
                 bytes: payloads and outputs up to {} bytes, log entries up to {} bytes)",
                report.server,
                report.stream,
                if report.existed {
                    "exists"
                } else {
                    "will be created"
                },
                report.messages,
                report.replicas,
                report.room.server,
                report.room.value,
                report.room.entry
            );
            let holds = report.room.value.min(report.room.entry);
            if config.host.max_payload > holds {
                line.push_str(&format!(
                    "; warning: [host] max_payload is {} bytes, more than the server holds: \
                     guest values are capped at {holds} bytes",
                    config.host.max_payload
                ));
            }
            line
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"file": file.display().to_string(), "store": store, "plugins": plugins, "contracts": contracts, "variables": values, "pooling": runtime.pooling(), "api_tokens": tokens, "traces": traces, "schedules": schedules.iter().map(|d| d.name.clone()).collect::<Vec<_>>()})
            )?
        );
    } else {
        println!("{}: ok", file.display());
        println!("store: {store}");
        for def in &schedules {
            println!("schedule {}: agent {}", def.name, def.agent);
        }
        for (name, world) in plugins {
            let contract = contracts.get(&name).copied().unwrap_or_default();
            println!("plugin {name}: {world} world, {contract}");
            for line in values.get(&name).into_iter().flatten() {
                println!("  {line}");
            }
        }
        for line in &tokens {
            println!("api: {line}");
        }
        if let Some(traces) = &traces {
            println!("traces: exported to {traces}");
        }
    }
    Ok(())
}

pub(super) fn inspect(file: &Path, json: bool) -> anyhow::Result<()> {
    let engine = wasmtime::Engine::default();
    // No config is read here: the default `[host] max_component_size` bounds the read.
    let bytes =
        crate::runtime::cache::read_component(file, crate::config::DEFAULT_MAX_COMPONENT_SIZE)?;
    let component = wasmtime::component::Component::new(&engine, &bytes)
        .wasm_context(|| format!("{} is not a loadable component", file.display()))?;
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    let exports: Vec<String> = ty
        .exports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    let world = detect_world(&engine, &component).map(|w| w.name()).ok();
    // The contract, or why the host would refuse it (two versions, an unserved one).
    let contract = world.map(|_| detect_contract(&engine, &component).map(|c| c.name()));
    if json {
        let (contract, refused) = match &contract {
            Some(Ok(c)) => (Some(*c), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"file": file.display().to_string(), "world": world, "contract": contract, "contract_error": refused, "imports": imports, "exports": exports})
            )?
        );
    } else {
        println!(
            "{}: {}",
            file.display(),
            match (world, &contract) {
                (Some(w), Some(Ok(c))) => format!("{w} world, {c}"),
                (Some(w), Some(Err(e))) => format!("{w} world, refused: {e}"),
                _ => "not a Homing agent".into(),
            }
        );
        println!("imports:");
        for name in imports {
            println!("  {name}");
        }
        println!("exports:");
        for name in exports {
            println!("  {name}");
        }
    }
    Ok(())
}
