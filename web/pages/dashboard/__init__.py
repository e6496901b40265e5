"""The live queue dashboard: routes, the board for one viewer, the charts."""
from web.pages.dashboard.routes import DashboardController

__all__ = ["DashboardController"]
