"""multiome"""
