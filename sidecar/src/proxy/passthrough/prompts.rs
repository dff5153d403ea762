//! Prompts of the upstreams, and completions: names get the same prefix as tools.

use std::collections::HashMap;

use orchestrator_crds::proxy::{PREFIX_SEPARATOR, ToolPrefix};
use rmcp::model::{
    ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
    GetPromptRequestParams, GetPromptResponse, ListPromptsRequest, Prompt, Reference,
    RequestMetaObject, ServerResult,
};

use super::{Feature, Reach, Relay, not_found, unexpected};
use crate::{
    error::{Error, Result},
    names::ServerName,
    session::SessionRef,
};

impl Relay<'_> {
    fn exposed_prompt(&self, server: &ServerName, name: &str) -> String {
        match self.snapshot().map(|s| s.config.tool_prefix) {
            Some(ToolPrefix::None) => name.to_string(),
            _ => format!("{server}{PREFIX_SEPARATOR}{name}"),
        }
    }

    /// `prompts/list`: the prompts of the running servers (starts nothing).
    pub async fn list_prompts(
        &self,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Prompt>> {
        self.collect_prompts(Reach::Running, session, meta).await
    }

    async fn collect_prompts(
        &self,
        reach: Reach,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<Vec<Prompt>> {
        let mut out = Vec::new();
        let mut routes = HashMap::new();
        for (server, conn) in self.connections_for(Feature::Prompts, reach, session).await {
            let prompts = self
                .list_all(
                    &conn,
                    &server.name,
                    "prompts/list",
                    meta,
                    |p| ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(p)),
                    |r| match r {
                        ServerResult::ListPromptsResult(page) => {
                            Some((page.prompts, page.next_cursor))
                        }
                        _ => None,
                    },
                )
                .await?;
            for mut prompt in prompts {
                let exposed = self.exposed_prompt(&server.name, &prompt.name);
                routes.insert(exposed.clone(), server.name.clone());
                prompt.name = exposed;
                out.push(prompt);
            }
        }
        self.passthrough.lock().prompts = routes;
        Ok(out)
    }

    /// Which server a prompt belongs to, and its name there.
    async fn prompt_route(
        &self,
        exposed: &str,
        what: &'static str,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<(ServerName, String)> {
        let prefix = self
            .snapshot()
            .map(|s| s.config.tool_prefix)
            .unwrap_or_default();
        if prefix == ToolPrefix::Server {
            let (server, name) = exposed
                .split_once(PREFIX_SEPARATOR)
                .ok_or_else(|| not_found("prompt", exposed))?;
            return Ok((ServerName::new(server), name.to_string()));
        }
        let reach = Reach::Start(what);
        if !self.passthrough.lock().prompts.contains_key(exposed) {
            self.collect_prompts(reach, session, meta).await?;
        }
        let known = self.passthrough.lock().prompts.get(exposed).cloned();
        let server = match known {
            Some(server) => server,
            // Unlisted name: with one server offering prompts, let it answer (its own "not
            // found" is what the client would have seen without the proxy).
            None => match self
                .connections_for(Feature::Prompts, reach, session)
                .await
                .as_slice()
            {
                [(server, _)] => server.name.clone(),
                _ => return Err(not_found("prompt", exposed)),
            },
        };
        Ok((server, exposed.to_string()))
    }

    pub async fn get_prompt(
        &self,
        mut params: GetPromptRequestParams,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<GetPromptResponse> {
        let (server, name) = self
            .prompt_route(&params.name, "prompts/get", session, meta)
            .await?;
        params.name = name;
        params.meta = None;
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        match self
            .relay_named(&server, session, "prompts/get", request, meta)
            .await?
        {
            ServerResult::GetPromptResult(mut r) => {
                // As for resources/read: 2026-07-28 clients require `resultType`.
                r.result_type
                    .get_or_insert(rmcp::model::ResultType::COMPLETE);
                Ok(GetPromptResponse::Complete(r))
            }
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(unexpected(&server, "prompts/get")),
        }
    }
    pub async fn complete(
        &self,
        mut params: CompleteRequestParams,
        session: &SessionRef,
        meta: &RequestMetaObject,
    ) -> Result<CompleteResult> {
        let server = match &mut params.r#ref {
            Reference::Prompt(p) => {
                let (server, name) = self
                    .prompt_route(&p.name, "completion/complete", session, meta)
                    .await?;
                p.name = name;
                server
            }
            Reference::Resource(r) => {
                self.resource_route(&r.uri, "completion/complete", session, meta)
                    .await?
            }
            _ => {
                return Err(Error::InvalidParams(
                    "unsupported completion reference".into(),
                ));
            }
        };
        params.meta = None;
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
        match self
            .relay_named(&server, session, "completion/complete", request, meta)
            .await?
        {
            ServerResult::CompleteResult(r) => Ok(r),
            _ => Err(unexpected(&server, "completion/complete")),
        }
    }
}
