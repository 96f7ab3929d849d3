module sluice.bench/fanout

go 1.22

require github.com/gorilla/websocket v1.4.2
