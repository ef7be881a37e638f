"""The settings of the rerankers that talk to something outside the process (`retrieval.rerank`
names the one in use; the policy deciding when to call it is `routers.rerank`'s)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from backends.sections import SECTION


class RemoteRerankConfig(BaseModel):
    """Any `/rerank` API litellm's `arerank` speaks: Cohere's shape (`cohere/<model>` with an
    `api_base` for TEI, Infinity, vLLM or a proxy serving `/v1/rerank`), Jina, Voyage, ..."""

    model_config = SECTION

    model: str = Field(min_length=1, description="litellm model string, e.g. 'cohere/rerank-v3.5'")
    api_base: str | None = None
    api_key_env: str | None = Field(
        default=None, description="name of the environment variable holding the API key"
    )
    # One attempt's bound; the rerank policy's `timeout_s` bounds the whole call, retries too.
    timeout_s: float = Field(default=2.0, gt=0, le=60)
    retries: int = Field(default=1, ge=0, le=5)
    cooldown_after: int = Field(
        default=3,
        ge=0,
        description="consecutive failed calls that make the reranker be skipped for cooldown_s "
        "(per tenant, and for every tenant once two fail), as for a model tier; 0 never skips",
    )
    cooldown_s: float = Field(default=30.0, gt=0)
    # What a call costs: Cohere bills search units (a query and up to 100 documents), token-
    # billed APIs tokens; the response's `meta.billed_units` says how many (a call that names
    # no search units is one).
    cost_per_search_unit_usd: float = Field(default=0.0, ge=0)
    cost_per_token_usd: float = Field(default=0.0, ge=0)


class OpenSearchRerankConfig(BaseModel):
    """A text-similarity (cross-encoder) model deployed in the cluster's ml-commons plugin; the
    cluster is `retrieval.opensearch.hosts`."""

    model_config = SECTION

    model_id: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_\-]{1,128}$",
        description="the ml-commons model id of a deployed TEXT_SIMILARITY model",
    )
    timeout_s: float = Field(default=2.0, gt=0, le=60)
