"""Every wire type of the stack, defined once: Redis messages and HTTP bodies (pydantic models).

One module per contract: ``trajectory`` (rollout → trainer over the ``trajectories`` stream) and ``weights``
(trainer → everyone over the ``weights`` stream). Service issues add ``retrieval``, ``inference``,
``search`` beside them. Servers and clients import the same classes.
"""

from shared.protocol.inference import (
    CollectiveRpcRequest,
    CompletionRequest,
    CompletionResponse,
    LoadLoRAAdapterRequest,
    ModelList,
    UnloadLoRAAdapterRequest,
)
from shared.protocol.retrieval import (
    Document,
    RetrievedDocument,
    RetrieveRequest,
    RetrieveResponse,
    ScoredDocument,
)
from shared.protocol.search import SearchRequest, SearchResponse
from shared.protocol.trajectory import Role, Sample, TrajectoryGroup
from shared.protocol.weights import (
    AdmissionMark,
    WeightUpdate,
    adapter_name,
    new_run_id,
    parse_adapter_name,
)

__all__ = [
    "AdmissionMark",
    "CollectiveRpcRequest",
    "CompletionRequest",
    "CompletionResponse",
    "Document",
    "LoadLoRAAdapterRequest",
    "ModelList",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrievedDocument",
    "Role",
    "Sample",
    "ScoredDocument",
    "SearchRequest",
    "SearchResponse",
    "TrajectoryGroup",
    "UnloadLoRAAdapterRequest",
    "WeightUpdate",
    "adapter_name",
    "new_run_id",
    "parse_adapter_name",
]
