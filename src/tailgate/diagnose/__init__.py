"""`tailgate diagnose`: explain a tail spike from evidence taken over the same window.

* :mod:`.evidence` reads the world during the window (the diagnose probe, counter polls);
* :mod:`.attribution` is pure: requests and events on one clock in, ranked causes out;
* :mod:`.timeline` bins both on a common time axis for the report.
"""
