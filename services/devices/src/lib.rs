//! Edge devices: machines behind NAT that connect *out* to the router over
//! framed TCP (`edge.listen`), register their services, and so become tools
//! of their tenant, named `<device>__<service>`.
//!
//! - `listen.rs`: the listener (plain TCP or TLS) and one task pair per
//!   connection: frames in (register, results, text tasks), frames out.
//! - this file: the [`Devices`] registry: which devices are connected for which
//!   tenant, the per-tenant view of their tools (an immutable snapshot
//!   swapped whole, like the catalog's), calls to a device, and the mapping of
//!   its answer to an MCP tool result.
//!
//! A device's tools are only ever visible to its own tenant. A disconnected
//! device keeps its tools for `edge.grace` (calls fail at once meanwhile) so
//! that a quick reconnect does not make clients' lists flicker; then they go
//! and the tenant's sessions get `notifications/tools/list_changed`, as they
//! do when a device registers or changes its services.

pub mod listen;
mod metrics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use switchboard_protocol::edge as frames;
use tokio::sync::{mpsc, oneshot, Notify};

pub use self::listen::{serve, tls_acceptor, Host, TaskRunner};
pub use self::metrics::Metrics;

/// `[edge]`: devices that connect out to the router over framed TCP.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Where devices connect; `None` for no edge listener.
    pub listen: Option<SocketAddr>,
    /// TLS certificate chain and private key (PEM); both or neither.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Largest frame accepted from a device (markers included).
    pub max_frame_bytes: usize,
    /// A connection must register within this long.
    pub register_timeout: Duration,
    /// Longest wait for a device's answer to a call.
    pub call_timeout: Duration,
    /// A disconnected device's tools stay this long, for it to reconnect.
    pub grace: Duration,
    /// The tool (exposed name) that answers devices' text tasks; `None` for none.
    pub task_handler: Option<String>,
    /// Longest wait for the task handler's answer.
    pub task_timeout: Duration,
    /// At most this many devices connected at once.
    pub max_devices: usize,
}

/// Why a call to a device failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The arguments do not match the schema the device registered.
    #[error("invalid arguments for {tool}: {invalid}")]
    InvalidArguments { tool: String, invalid: switchboard_protocol::schema::Invalid },
    /// The call would not fit in one frame the device takes.
    #[error("the call is {size} bytes as a frame; devices take frames of at most {max} bytes (edge.max_frame_bytes)")]
    TooLarge { size: usize, max: usize },
    /// No answer in time.
    #[error("device {device:?} did not answer within {after:?}")]
    Timeout { device: Arc<str>, after: std::time::Duration },
    /// The device is not connected, or left before answering.
    #[error("device {device:?} is unavailable: {why}")]
    Unavailable { device: Arc<str>, why: Unavailable },
}

/// Why a device could not take a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// Disconnected; its tools stay listed for the grace period.
    #[error("the device is disconnected; its tools stay listed for {0:?} in case it reconnects")]
    Disconnected(std::time::Duration),
    /// Its connection closed while the call was being sent.
    #[error("connection closed before the answer")]
    Closed,
    /// It disconnected after the call was sent.
    #[error("the device disconnected before answering")]
    LeftBeforeAnswering,
}

/// One registered service, as a tool.
#[derive(Debug)]
pub struct Service {
    /// The device's own name for it (sent in `call` frames).
    pub name: String,
    /// The exposed tool name: `<device><separator><service>`.
    pub tool: String,
    /// Its input schema (the registered `parameters`).
    pub schema: Value,
    /// The tool object for `tools/list`, serialised once.
    pub json: Bytes,
}

/// A device and the services it registered last.
pub struct Device {
    pub tenant: Arc<str>,
    pub name: Arc<str>,
    pub services: Vec<Service>,
    /// The connection that registered them.
    pub link: Arc<Link>,
    pub registered_at_ms: i64,
}

/// What a device answered to a call.
#[derive(Debug)]
pub struct Answer {
    pub success: bool,
    pub data: Option<Value>,
    pub error: Option<Value>,
}

/// One device connection: its outgoing frames and the calls waiting on it.
pub struct Link {
    pub id: u64,
    pub remote: SocketAddr,
    pub tls: bool,
    pub connected_at_ms: i64,
    /// Prefix of the key the device registered with (empty with auth off).
    pub key_prefix: Mutex<Arc<str>>,
    out: mpsc::Sender<Bytes>,
    pending: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    closed: AtomicBool,
    close_notify: Notify,
    seq: AtomicU16,
}

impl Link {
    fn new(id: u64, remote: SocketAddr, tls: bool, out: mpsc::Sender<Bytes>) -> Arc<Link> {
        Arc::new(Link {
            id,
            remote,
            tls,
            connected_at_ms: switchboard_core::time::now_ms(),
            key_prefix: Mutex::new(Arc::from("")),
            out,
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            close_notify: Notify::new(),
            seq: AtomicU16::new(0),
        })
    }

    /// The next seq of an MCP frame on this connection.
    fn next_seq(&self) -> u16 {
        self.seq.fetch_add(1, Ordering::Relaxed) % 10_000
    }

    /// Queues a JSON message as one MCP frame.
    pub async fn send_json(&self, message: &Value) -> Result<(), ()> {
        let mut out = BytesMut::new();
        frames::encode_json(self.next_seq(), &serde_json::to_vec(message).expect("serializable"), &mut out);
        self.send_raw(out.freeze()).await
    }

    /// Queues encoded frames.
    pub async fn send_raw(&self, frames: Bytes) -> Result<(), ()> {
        if self.is_closed() {
            return Err(());
        }
        self.out.send(frames).await.map_err(|_| ())
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Ends the connection: calls waiting on it fail at once.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.close_notify.notify_waiters();
        }
        self.pending.lock().expect("lock").clear();
    }

    /// Completes when [`Link::close`] has been called.
    pub async fn closed(&self) {
        loop {
            // Registered before the check, so a close in between still wakes us.
            let notified = self.close_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    /// Queues a message only if there is room at once (error replies: a
    /// peer that does not read must not stall the reader). `false` if not.
    pub fn try_send_json(&self, message: &Value) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut out = BytesMut::new();
        frames::encode_json(self.next_seq(), &serde_json::to_vec(message).expect("serializable"), &mut out);
        self.out.try_send(out.freeze()).is_ok()
    }

    /// Hands a `result` to the call waiting for it; `false` if none is.
    fn answer(&self, call_id: &str, answer: Answer) -> bool {
        match self.pending.lock().expect("lock").remove(call_id) {
            Some(waiter) => waiter.send(answer).is_ok(),
            None => false,
        }
    }
}

/// A tenant's device tools at one moment.
#[derive(Default)]
pub struct View {
    by_name: HashMap<String, (Arc<Device>, usize)>,
    /// The tool objects, comma-separated, in name order.
    pub json: Bytes,
}

impl View {
    /// How many tools.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there is no tool.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// A device or service the registry refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("{0}")]
    Invalid(String),
    #[error("this router already has its limit of {0} devices")]
    Full(usize),
}

/// A service left out of a registration, and why.
pub type Refused = (String, String);

/// Devices by (tenant, device name).
type ByName = HashMap<(Arc<str>, Arc<str>), Arc<Device>>;

/// The registry of connected devices.
pub struct Devices {
    pub config: EdgeConfig,
    separator: String,
    /// Prefixes of configured upstreams, which device names must not take.
    reserved: Vec<String>,
    devices: Mutex<ByName>,
    views: ArcSwap<HashMap<Arc<str>, Arc<View>>>,
    /// Devices in the registry (connected or in their grace period).
    count: AtomicU64,
    next_call: AtomicU64,
    next_link: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Devices {
    pub fn new(config: EdgeConfig, separator: &str, reserved: Vec<String>, metrics: Arc<Metrics>) -> Devices {
        Devices {
            config,
            separator: separator.to_owned(),
            reserved,
            devices: Mutex::new(HashMap::new()),
            views: ArcSwap::default(),
            count: AtomicU64::new(0),
            next_call: AtomicU64::new(1),
            next_link: AtomicU64::new(1),
            metrics,
        }
    }

    /// Whether any device is registered (one atomic load: the hot path's
    /// whole cost of edge support when no device is).
    pub fn has_devices(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// The device tools `tenant` sees, if any.
    pub fn view(&self, tenant: &str) -> Option<Arc<View>> {
        if !self.has_devices() {
            return None;
        }
        self.views.load().get(tenant).filter(|v| !v.is_empty()).cloned()
    }

    /// The device and service behind tool `name` of `tenant`.
    pub fn lookup(&self, tenant: &str, name: &str) -> Option<(Arc<Device>, usize)> {
        self.view(tenant)?.by_name.get(name).cloned()
    }

    /// A new connection's link and the receiving end of its outgoing frames.
    pub fn link(&self, remote: SocketAddr, tls: bool) -> (Arc<Link>, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(256);
        (Link::new(self.next_link.fetch_add(1, Ordering::Relaxed), remote, tls, tx), rx)
    }

    /// Checks a device name: letters, digits, `_` and `-`, without the
    /// catalog's separator, and not an upstream's prefix.
    pub fn check_device_name(&self, name: &str) -> Result<(), RegisterError> {
        if !switchboard_core::ids::valid_name(name) {
            return Err(RegisterError::Invalid(format!(
                "device name {name:?} must be 1 to 48 letters, digits, '_' or '-'"
            )));
        }
        if name.contains(&self.separator) {
            return Err(RegisterError::Invalid(format!(
                "device name {name:?} must not contain the separator {:?}",
                self.separator
            )));
        }
        if self.reserved.iter().any(|r| r.eq_ignore_ascii_case(name)) {
            return Err(RegisterError::Invalid(format!(
                "device name {name:?} is the prefix of an upstream of this router; choose another"
            )));
        }
        Ok(())
    }

    /// Builds the services of a `register` message. Services that cannot be
    /// tools are left out and reported by name.
    pub fn services(&self, device: &str, registered: &serde_json::Map<String, Value>) -> (Vec<Service>, Vec<Refused>) {
        let mut services: Vec<Service> = Vec::new();
        let mut refused = Vec::new();
        for (name, spec) in registered {
            let description = spec.get("description").and_then(Value::as_str).unwrap_or("").to_owned();
            let schema = match spec.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(Value::Object(schema)) => {
                    let mut schema = schema.clone();
                    match schema.get("type") {
                        None => {
                            schema.insert("type".into(), json!("object"));
                        }
                        Some(t) if t == "object" => {}
                        Some(_) => {
                            refused.push((name.clone(), "parameters must be a JSON Schema of type \"object\"".into()));
                            continue;
                        }
                    }
                    Value::Object(schema)
                }
                Some(_) => {
                    refused.push((name.clone(), "parameters must be a JSON Schema object".into()));
                    continue;
                }
            };
            if name.is_empty() || name.len() > 128 {
                refused.push((name.clone(), "a service name must be 1 to 128 characters".into()));
                continue;
            }
            let tool = switchboard_catalog::naming::expose_name(device, &self.separator, name);
            if services.iter().any(|s| s.tool == tool) {
                refused.push((name.clone(), format!("its tool name {tool:?} is taken by another service")));
                continue;
            }
            let object = json!({"name": tool, "description": description, "inputSchema": schema});
            let json = Bytes::from(serde_json::to_vec(&object).expect("serializable"));
            services.push(Service { name: name.clone(), tool, schema, json });
        }
        services.sort_by(|a, b| a.tool.cmp(&b.tool));
        (services, refused)
    }

    /// Registers (or replaces) a device's services. If another connection
    /// held this device, it is closed: the newest connection wins. Returns
    /// the device as registered.
    /// Services whose tool name another device of the tenant already holds
    /// are left out and returned with the reason.
    pub fn register(&self, mut device: Device) -> Result<(Arc<Device>, Vec<Refused>), RegisterError> {
        let key = (device.tenant.clone(), device.name.clone());
        let mut taken = Vec::new();
        let replaced = {
            let mut devices = self.devices.lock().expect("lock");
            // A connection already closed (replaced meanwhile) must not
            // take the device back from the live one.
            if device.link.is_closed() {
                return Err(RegisterError::Invalid("this connection is closed".into()));
            }
            if !devices.contains_key(&key) && devices.len() >= self.config.max_devices {
                return Err(RegisterError::Full(self.config.max_devices));
            }
            device.services.retain(|s| {
                let holder = devices
                    .iter()
                    .find(|((t, n), d)| *t == key.0 && *n != key.1 && d.services.iter().any(|o| o.tool == s.tool));
                match holder {
                    Some(((_, other), _)) => {
                        taken
                            .push((s.name.clone(), format!("its tool name {:?} is taken by device {other:?}", s.tool)));
                        false
                    }
                    None => true,
                }
            });
            let device = Arc::new(device);
            let replaced = devices.insert(key, device.clone());
            self.count.store(devices.len() as u64, Ordering::Relaxed);
            self.rebuild(&devices, &device.tenant);
            (device, replaced)
        };
        let (device, replaced) = replaced;
        if let Some(old) = replaced {
            if old.link.id != device.link.id {
                tracing::info!(tenant = %device.tenant, device = %device.name, "a new connection replaces the device's old one");
                old.link.close();
            }
        }
        self.update_gauges();
        Ok((device, taken))
    }

    /// Removes `device` if `link` still holds it (a newer connection may have
    /// taken it over meanwhile). Returns whether it was removed.
    pub fn remove_if_held(&self, tenant: &Arc<str>, device: &Arc<str>, link: &Link) -> bool {
        let removed = {
            let mut devices = self.devices.lock().expect("lock");
            let key = (tenant.clone(), device.clone());
            let held = devices.get(&key).is_some_and(|d| d.link.id == link.id);
            if held {
                devices.remove(&key);
                self.count.store(devices.len() as u64, Ordering::Relaxed);
                self.rebuild(&devices, tenant);
            }
            held
        };
        self.update_gauges();
        removed
    }

    /// Removes every device at shutdown.
    pub fn close_all(&self) {
        let devices: Vec<Arc<Device>> = {
            let mut devices = self.devices.lock().expect("lock");
            let all = devices.drain().map(|(_, d)| d).collect();
            self.count.store(0, Ordering::Relaxed);
            self.views.store(Arc::default());
            all
        };
        for d in devices {
            d.link.close();
        }
        self.update_gauges();
    }

    /// Rebuilds one tenant's view (under the devices lock).
    fn rebuild(&self, devices: &ByName, tenant: &Arc<str>) {
        let mut tools: Vec<(&str, Arc<Device>, usize)> = Vec::new();
        for ((t, _), d) in devices.iter() {
            if t == tenant {
                for (i, s) in d.services.iter().enumerate() {
                    tools.push((&s.tool, d.clone(), i));
                }
            }
        }
        tools.sort_by(|a, b| a.0.cmp(b.0));
        let mut json = BytesMut::new();
        let mut by_name = HashMap::with_capacity(tools.len());
        for (name, d, i) in tools {
            if by_name.contains_key(name) {
                continue; // `register` refuses a tool name another device holds
            }
            if !json.is_empty() {
                json.extend_from_slice(b",");
            }
            json.extend_from_slice(&d.services[i].json);
            by_name.insert(name.to_owned(), (d, i));
        }
        let mut views: HashMap<Arc<str>, Arc<View>> = (**self.views.load()).clone();
        if by_name.is_empty() {
            views.remove(tenant);
        } else {
            views.insert(tenant.clone(), Arc::new(View { by_name, json: json.freeze() }));
        }
        self.views.store(Arc::new(views));
    }

    /// Updates the device gauges (a device went into its grace period).
    pub fn refresh_gauges(&self) {
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let devices = self.devices.lock().expect("lock");
        let connected = devices.values().filter(|d| !d.link.is_closed()).count();
        let services: usize = devices.values().map(|d| d.services.len()).sum();
        self.metrics.set_devices(connected, devices.len() - connected, services);
    }

    /// The devices of one tenant, or of all, for the admin API.
    pub fn describe(&self, tenant: Option<&str>) -> Vec<Value> {
        let devices = self.devices.lock().expect("lock");
        let mut out: Vec<Value> = devices
            .values()
            .filter(|d| tenant.is_none_or(|t| *d.tenant == *t))
            .map(|d| {
                json!({
                    "tenant": &*d.tenant,
                    "device": &*d.name,
                    "connected": !d.link.is_closed(),
                    "remote": d.link.remote.to_string(),
                    "tls": d.link.tls,
                    "key_prefix": &**d.link.key_prefix.lock().expect("lock"),
                    "connected_at": switchboard_core::time::format_time(d.link.connected_at_ms),
                    "registered_at": switchboard_core::time::format_time(d.registered_at_ms),
                    "calls_in_flight": d.link.pending.lock().expect("lock").len(),
                    "services": d.services.iter().map(|s| json!({"name": s.name, "tool": s.tool})).collect::<Vec<_>>(),
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (a["tenant"].as_str(), a["device"].as_str()).cmp(&(b["tenant"].as_str(), b["device"].as_str()))
        });
        out
    }

    /// Calls service `index` of `device` with `arguments` (already parsed),
    /// after checking them against its schema. Returns the MCP tool result
    /// (the `result` object, as JSON text). With `traceparent` (the call is
    /// traced), the call message carries it in `data.traceparent`, for a
    /// device that continues the trace (others ignore it).
    pub async fn call(
        &self,
        device: &Device,
        index: usize,
        arguments: &Value,
        traceparent: Option<&str>,
    ) -> Result<Vec<u8>, CallError> {
        let service = &device.services[index];
        switchboard_protocol::schema::check(&service.schema, arguments, "arguments")
            .map_err(|invalid| CallError::InvalidArguments { tool: service.tool.clone(), invalid })?;
        let unavailable = |why| CallError::Unavailable { device: device.name.clone(), why };
        let link = &device.link;
        if link.is_closed() {
            return Err(unavailable(Unavailable::Disconnected(self.config.grace)));
        }
        let call_id = format!("sb-{}", self.next_call.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        link.pending.lock().expect("lock").insert(call_id.clone(), tx);
        // Removes the waiter however this call ends (timeout, client gone).
        struct Waiter<'a>(&'a Link, &'a str);
        impl Drop for Waiter<'_> {
            fn drop(&mut self) {
                self.0.pending.lock().expect("lock").remove(self.1);
            }
        }
        let _waiter = Waiter(link, &call_id);
        if link.is_closed() {
            return Err(unavailable(Unavailable::Closed));
        }
        let mut message = json!({
            "type": "call",
            "data": {"call_id": call_id, "method": service.name, "params": arguments},
        });
        if let Some(traceparent) = traceparent {
            message["data"]["traceparent"] = Value::String(traceparent.to_owned());
        }
        let mut frame = BytesMut::new();
        frames::encode_json(link.next_seq(), &serde_json::to_vec(&message).expect("serializable"), &mut frame);
        if frame.len() > self.config.max_frame_bytes {
            return Err(CallError::TooLarge { size: frame.len(), max: self.config.max_frame_bytes });
        }
        let deadline = tokio::time::Instant::now() + self.config.call_timeout;
        let sent = tokio::time::timeout_at(deadline, link.send_raw(frame.freeze())).await;
        match sent {
            Err(_) => return Err(CallError::Timeout { device: device.name.clone(), after: self.config.call_timeout }),
            Ok(Err(())) => return Err(unavailable(Unavailable::Closed)),
            Ok(Ok(())) => self.metrics.frame_out(frames::MCP),
        }
        let answer = tokio::select! {
            answer = rx => answer,
            () = tokio::time::sleep_until(deadline) => {
                return Err(CallError::Timeout { device: device.name.clone(), after: self.config.call_timeout });
            }
        };
        let answer = answer.map_err(|_| unavailable(Unavailable::LeftBeforeAnswering))?;
        Ok(tool_result(answer))
    }
}

/// A device's answer as an MCP tool result: text data as text; other JSON
/// data as its JSON text, and objects also as `structuredContent`; a
/// failure as `isError: true` with the error text.
pub fn tool_result(answer: Answer) -> Vec<u8> {
    let text_of = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let result = if answer.success {
        match answer.data {
            None | Some(Value::Null) => json!({"content": []}),
            Some(Value::String(s)) => json!({"content": [{"type": "text", "text": s}]}),
            Some(data @ Value::Object(_)) => {
                json!({"content": [{"type": "text", "text": data.to_string()}], "structuredContent": data})
            }
            Some(data) => json!({"content": [{"type": "text", "text": text_of(&data)}]}),
        }
    } else {
        let text = match answer.error.as_ref().or(answer.data.as_ref()) {
            Some(e) if !e.is_null() => text_of(e),
            _ => "the device reported a failure without saying why".to_owned(),
        };
        json!({"content": [{"type": "text", "text": text}], "isError": true})
    };
    serde_json::to_vec(&result).expect("serializable")
}
