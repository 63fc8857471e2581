"""A search-path plugin only for its timing: Hydra calls it whenever it sets up a config search path (hydra.main, the
Compose API, in every process), before it composes anything. When rlcli's conf/ is on the path, the algorithms'
constructor defaults are stored for conf/algo/*.yaml to pull in; other Hydra apps are left alone."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class RlcliAlgoDefaults(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from rlcli.run.compose import conf_dir

        ours = Path(conf_dir())
        for element in search_path.get_path():
            path = element.path or ""
            scheme, _, location = path.rpartition("://")
            if (scheme == "pkg" and location.split("/")[0].split(".")[0] == "rlcli") or \
                    (scheme in ("", "file") and location and Path(location).resolve() == ours):
                from rlcli.run.algo_defaults import register

                register()
                return
