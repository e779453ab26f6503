"""protein"""
