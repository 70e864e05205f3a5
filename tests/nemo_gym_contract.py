"""NeMo-Gym's pivot-row contract, re-implemented for tests (no NeMo-Gym install, no network).

Read from NeMo-Gym's sources: the row models (`nemo_gym/openai_utils.py`:
NeMoGymResponseCreateParamsNonStreaming and its input-item union; `resources_servers/
single_step_tool_use_with_argument_comparison/common/verification_utils.py`: ExpectedAction)
and the checks of `.agents/skills/nemo-gym-pivot-datasets/scripts/validate_pivot_dataset.py`.
The models keep the constraints that decide acceptance (required fields, literals, extra="forbid"
on the request); field types the rows never use are loosened to `Any`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from typing_extensions import NotRequired, Required, TypedDict

Status = Literal["in_progress", "completed", "incomplete"]


class InputText(TypedDict, total=False):
    text: Required[str]
    type: Required[Literal["input_text"]]


class InputImage(TypedDict, total=False):
    detail: Required[Literal["low", "high", "auto", "original"]]
    type: Required[Literal["input_image"]]
    file_id: Optional[str]
    image_url: Optional[str]


class InputFile(TypedDict, total=False):
    type: Required[Literal["input_file"]]
    file_data: str
    file_id: Optional[str]
    filename: str


InputContent = Union[InputText, InputImage, InputFile]


class Summary(BaseModel):
    text: str
    type: Literal["summary_text"]


class ReasoningItem(BaseModel):
    id: str  # required: the reason reasoning items without one fail
    summary: list[Summary]
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: Optional[str] = None
    content: Optional[list[Any]] = None


class OutputText(BaseModel):
    annotations: list[Any]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: Optional[list[Any]] = None


class OutputRefusal(BaseModel):
    refusal: str
    type: Literal["refusal"] = "refusal"


class OutputMessage(BaseModel):
    id: str
    content: list[Union[OutputText, OutputRefusal]]
    role: Literal["assistant"] = "assistant"
    status: Status = "completed"
    type: Literal["message"] = "message"


class EasyInputMessage(BaseModel):
    content: Union[str, list[InputContent]]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"


class InputMessage(BaseModel):
    content: list[InputContent]
    role: Literal["user", "system", "developer"]
    status: Status = "completed"
    type: Literal["message"] = "message"


class FunctionCallOutput(BaseModel):
    call_id: str
    output: Union[str, list[Any]]
    type: Literal["function_call_output"] = "function_call_output"
    id: Optional[str] = None
    status: Optional[Status] = None


class FunctionToolCall(BaseModel):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: Optional[str] = None
    status: Optional[Status] = None


InputItem = Union[EasyInputMessage, InputMessage, OutputMessage, FunctionToolCall,
                  FunctionCallOutput, ReasoningItem]


class FunctionTool(TypedDict, total=False):
    name: Required[str]
    parameters: Required[Optional[dict[str, object]]]
    strict: Required[Optional[bool]]
    type: Required[Literal["function"]]
    description: NotRequired[Optional[str]]


class ResponseCreateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    background: Optional[bool] = None
    include: Optional[list[str]] = None
    input: Union[str, list[InputItem]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    model: Optional[str] = None
    parallel_tool_calls: bool = True
    previous_response_id: Optional[str] = None
    prompt: Optional[Any] = None
    reasoning: Optional[Any] = None
    service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority"]] = None
    store: Optional[bool] = None
    temperature: Optional[float] = None
    text: Optional[Any] = None
    tool_choice: Any = "auto"
    tools: list[FunctionTool] = Field(default_factory=list)
    top_logprobs: Optional[int] = None
    top_p: Optional[float] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    user: Optional[str] = None
    stream: Optional[Literal[False]] = None


class MessageAction(BaseModel):
    type: Literal["message"]
    content: str


class FunctionCallAction(BaseModel):
    type: Literal["function_call"]
    name: str
    arguments: str


class FunctionCallBatchAction(BaseModel):
    type: Literal["function_call_batch"]
    calls: list[FunctionCallAction] = Field(min_length=1)


ExpectedAction = TypeAdapter(Annotated[Union[MessageAction, FunctionCallAction,
                                             FunctionCallBatchAction], Field(discriminator="type")])


# ---------------------------------------------------------------- validate_pivot_dataset.py


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    if isinstance(tool.get("name"), str):
        return tool["name"]
    fn = tool.get("function")
    return fn["name"] if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None


def validator_problem(row: Any, check_tool_names: bool = True) -> str | None:
    """The first problem NeMo-Gym's pivot-dataset validator reports for one row, or None. It
    accepts `function_call` and `message` actions only (one call per row)."""
    if not isinstance(row, dict):
        return "row must be an object"
    for key in ("responses_create_params", "expected_action", "agent_ref"):
        if key not in row:
            return f"missing required key {key!r}"
    ref = row["agent_ref"]
    if not isinstance(ref, dict) or ref.get("type") != "responses_api_agents":
        return "agent_ref.type must be responses_api_agents"
    if not isinstance(ref.get("name"), str) or not ref["name"]:
        return "agent_ref.name must be a non-empty string"
    params = row["responses_create_params"]
    if not isinstance(params, dict):
        return "responses_create_params must be an object"
    if "metadata" in params and params["metadata"] is None:
        return "responses_create_params.metadata must be omitted or non-null"
    if "tool_choice" in params and params["tool_choice"] != "auto":
        return "responses_create_params.tool_choice should be 'auto'"
    if not isinstance(params.get("input"), list) or not params["input"]:
        return "responses_create_params.input must be a non-empty list"
    if not isinstance(params.get("tools"), list):
        return "responses_create_params.tools must be a list"
    if "parallel_tool_calls" in params and not isinstance(params["parallel_tool_calls"], bool):
        return "responses_create_params.parallel_tool_calls must be a boolean"
    tools = {n for t in params["tools"] if (n := _tool_name(t))}
    action = row["expected_action"]
    if not isinstance(action, dict):
        return "expected_action must be an object"
    if action.get("type") == "message":
        return None if isinstance(action.get("content"), str) else "message content must be a string"
    if action.get("type") != "function_call":
        return f"unsupported expected_action type {action.get('type')!r}"
    if not isinstance(action.get("name"), str) or not action["name"]:
        return "function_call is missing a non-empty name"
    if not isinstance(action.get("arguments"), str):
        return "function_call.arguments must be a JSON string"
    try:
        json.loads(action["arguments"])
    except ValueError:
        return "function_call.arguments is not valid JSON"
    if check_tool_names and action["name"] not in tools:
        return "expected_action uses tools absent from responses_create_params.tools"
    return None


def model_errors(row: dict[str, Any]) -> list[str]:
    """Pydantic errors of the row's request and action under the models above."""
    errors = []
    for check in (lambda: ResponseCreateParams(**row["responses_create_params"]),
                  lambda: ExpectedAction.validate_python(row["expected_action"])):
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion message
            errors.append(str(exc))
    return errors
