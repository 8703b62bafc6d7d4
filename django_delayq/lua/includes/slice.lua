-- Values per unpack(): well under the C stack limit of Redis's Lua (8,000).
local SLICE = 1000
