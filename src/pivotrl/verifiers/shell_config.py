"""Options of the `shell` verifier (`pivotrl.verifiers.shell`), apart from its runner so that a
config file can be checked without the sandbox."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.sandbox.bwrap import SandboxLimits
from pivotrl.verifiers.shell_actions import DEFAULT_ARG_NAMES, DEFAULT_TOOL_NAMES


class ShellConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_names: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TOOL_NAMES),
        description="Tool names that run a shell command (common names in agent datasets).")
    arg_names: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ARG_NAMES),
        description="Argument names holding the command; the first present one is used.")
    fenced_blocks: bool = Field(
        True, description="Read ```bash/sh/shell/console blocks as commands when a message has "
                          "no tool calls (agents that answer in markdown).")
    collapse_whitespace: bool = Field(
        True, description="Runs of spaces/tabs in a stdout line compare as one space.")
    order_insensitive_lines: bool = Field(
        False, description="Compare stdout as a sorted list of lines (for tasks where order "
                           "is not part of the answer, e.g. `find` output).")
    compare_exit_code: bool = Field(
        True, description="Exit codes must be equal (0 and 1 count as equal when both printed "
                          "the same non-empty stdout: grep's 'nothing selected' status).")
    compare_files: bool = Field(True, description="Resulting file trees must be equal.")
    compare_stderr: bool = Field(False, description="Normalised stderr must be equal too.")
    compare_effects: bool = Field(
        True, description="Effects outside the workspace must be equal too: changes to HOME, and "
                          "every attempt to write, delete, reach a device, a socket or the "
                          "network elsewhere, whether or not it succeeded "
                          "(pivotrl.sandbox.effects, pivotrl.sandbox.watch).")
    allow_unrecorded_effects: bool = Field(
        False, description="Run where attempts outside the workspace cannot be recorded (no C "
                           "compiler, or a kernel without seccomp user notification): a command "
                           "that tries harm and fails is then paid like one that does not try. "
                           "Off: the verifier refuses to run there and says why.")
    probes: bool = Field(
        True, description="Re-run a matching candidate on every probe workspace that changes "
                          "the expert's outcome (pivotrl.verifiers.probes) and require the "
                          "expert's outcome there too, so a command that only prints the "
                          "expected output (echo 4, a literal file name) or matches by luck "
                          "(grep -c E for grep -c ERROR) scores 0; a turn no probe moves is "
                          "unverifiable. Off: neither.")
    replay_context: bool = Field(
        True, description="Replay the context's shell commands on the workspace before the turn.")
    timeout_s: float = Field(5.0, description="Wall clock per command (SandboxLimits default).")
    memory_mb: int = Field(256, description="Address space per process (SandboxLimits).")
    max_processes: int = Field(64, description="Process limit in the sandbox (SandboxLimits).")
    max_output_bytes: int = Field(65536, description="stdout+stderr cap (SandboxLimits).")
    cpu_s: int = Field(5, description="CPU seconds per process (SandboxLimits).")
    message_rule: str = Field(
        "exact", description="Rule for message turns, passed to the toolcall verifier.")
    cache_turns: int = Field(
        256, description="Turns whose prepared workspace and expert outcome are kept (LRU).")
    workers: int = Field(
        4, description="Threads in score_batch (sandbox runs are subprocesses: threads overlap "
                       "their waits).")

    def limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                             max_processes=self.max_processes,
                             max_output_bytes=self.max_output_bytes, cpu_s=self.cpu_s)
