# What bench-wrk.sh and bench-instr.sh send, written once: user tokens and wrk's Lua purchase
# request. Sourced (functions only).

# HS256 tokens for users 1..N (default 2,000), one a line, signed as `flashsale token` signs them.
sign_tokens() { # secret [n]
    python3 - "$1" "${2:-2000}" <<'EOF'
import base64, hashlib, hmac, json, sys, time
secret, users = sys.argv[1].encode(), int(sys.argv[2])
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"typ": "JWT", "alg": "HS256"}).encode())
for u in range(1, users + 1):
    body = b64(json.dumps({"sub": str(u), "exp": int(time.time()) + 3600}).encode())
    sig = b64(hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest())
    print(f"{head}.{body}.{sig}")
EOF
}

# wrk's Lua script for purchases, on stdout: each user's request head formatted once at wrk's
# start (from the tokens in file $1), a purchase adding only its body; args[1] names the round
# (a purchase's request id is the round's name and a counter: never sent before).
purchase_lua() { # tokens-file
    cat <<EOF
local heads, n, run = {}, 0, "0"
init = function(args)
    run = args[1]
    local host = wrk.headers["Host"]
    for line in io.lines("$1") do
        heads[#heads + 1] = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. host
            .. "\r\nauthorization: Bearer " .. line
            .. "\r\ncontent-type: application/json\r\ncontent-length: "
    end
end
request = function()
    n = n + 1
    local body = '{"request_id":"' .. run .. "-" .. n .. '","quantity":1}'
    return heads[(n % #heads) + 1] .. #body .. "\r\n\r\n" .. body
end
EOF
}
