//! Edge devices as a tool source: a tenant's device tools come after the
//! catalog's in `tools/list` (on its last page), and are asked first in
//! `tools/call`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use switchboard_core::policy::Tenant;
use switchboard_devices::{Device, Devices};

use super::{LocalTool, Lookup, Page, Tool, ToolSource};
use crate::error::Error;

/// The devices' tools.
pub struct DeviceTools(pub Arc<Devices>);

#[async_trait]
impl ToolSource for DeviceTools {
    fn list(&self, tenant: &Tenant, page: &mut Page) -> Result<(), Error> {
        if page.is_cut() {
            return Ok(());
        }
        if let Some(view) = self.0.view(&tenant.name) {
            page.push_run(view.json.clone(), view.len());
        }
        Ok(())
    }

    /// Costs one atomic load when no device is registered. The name is
    /// read borrowed; the arguments are decoded only for a device tool.
    fn resolve(&self, tenant: &Tenant, name: &str, params: &RawValue) -> Lookup {
        if !self.0.has_devices() {
            return Lookup::Missing;
        }
        let Some((device, index)) = self.0.lookup(&tenant.name, name) else { return Lookup::Missing };
        #[derive(serde::Deserialize)]
        struct Call {
            #[serde(default)]
            arguments: Option<Value>,
        }
        let arguments = serde_json::from_str::<Call>(params.get()).ok().and_then(|c| c.arguments);
        let call =
            DeviceCall { devices: self.0.clone(), device, index, arguments: arguments.unwrap_or_else(|| json!({})) };
        Lookup::Found(Tool::Local(Box::new(call)))
    }
}

/// A `tools/call` of a device's service.
struct DeviceCall {
    devices: Arc<Devices>,
    device: Arc<Device>,
    index: usize,
    arguments: Value,
}

#[async_trait]
impl LocalTool for DeviceCall {
    fn served_by(&self) -> Arc<str> {
        Arc::from(format!("edge:{}", self.device.name))
    }

    async fn call(self: Box<Self>, traceparent: Option<String>) -> Result<Vec<u8>, Error> {
        Ok(self.devices.call(&self.device, self.index, &self.arguments, traceparent.as_deref()).await?)
    }
}
