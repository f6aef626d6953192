"""preprocessing"""
