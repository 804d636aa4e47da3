"""User-facing errors: raised for bad input, printed by the CLI as one clear line (no traceback)."""


class PrecswitchError(Exception):
    """Bad input or an impossible request. The message names the key/file/precision and what is allowed."""


class PrecisionUnsupported(PrecswitchError):
    """The requested precision cannot run on this device (e.g. tf32 on CPU, bf16 on a pre-Ampere GPU)."""


#: Exit code of ``precswitch`` for a user error (bad input); distinct from a crash (1).
EXIT_USER_ERROR = 2
#: Exit code after SIGTERM: resumable state saved, run the same command again to resume.
EXIT_PREEMPTED = 75
