"""Several models in one process: the model set, its memory budget, keep_alive, who decides
what is loaded (shared mode) and the fair turns their engines share the CPU by. Torch-free:
app passes the loaders in."""
from engine.models.budget import Budget, Resident
from engine.models.entry import ModelEvent, ModelInfo
from engine.models.keep_alive import DEFAULT_KEEP_ALIVE, parse_keep_alive
from engine.models.memory import release_memory, rss_bytes, total_memory
from engine.models.model_set import KEEP, ModelSet, UnknownModel
from engine.models.sharing import LoadRefused, SharingRules
from engine.models.source import LoadedModel, ModelSource
from engine.models.turns import FairTurns
from engine.models.views import ModelView

__all__ = ["DEFAULT_KEEP_ALIVE", "KEEP", "Budget", "FairTurns", "LoadRefused", "LoadedModel",
           "ModelEvent", "ModelInfo", "ModelSet", "ModelSource", "ModelView", "Resident",
           "SharingRules", "UnknownModel", "parse_keep_alive", "release_memory", "rss_bytes",
           "total_memory"]
