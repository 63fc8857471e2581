"""Puts the package's conf/ on Hydra's search path, so `algo=vpg_example` is a config choice."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class RlcliExamplePluginSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="rlcli-example-plugin", path="pkg://rlcli_example_plugin.conf")
